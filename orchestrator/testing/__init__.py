"""Test support: the scripted fake OpenAI-compatible model server (the only faked part)."""

from orchestrator.testing.fake_model import FakeModelServer
from orchestrator.testing.script import parse_script

__all__ = ["FakeModelServer", "parse_script"]
