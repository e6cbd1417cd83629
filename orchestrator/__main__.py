"""``python -m orchestrator`` is ``prime-agent``."""

from orchestrator.cli.entry import main

main()
