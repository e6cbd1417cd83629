"""``python -m orchestrator`` is ``prime-agent``."""

from orchestrator.cli.app import main

main()
