"""daemon/config_watch.py: new sessions read config.toml as it is now."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.daemon.config_watch import ConfigWatch, restart_notice
from orchestrator.errors import ConfigError
from orchestrator.settings import load_settings


def _write(path: Path, text: str, bump_ns: int) -> None:
    path.write_text(text)
    st = path.stat()
    # The same second on a coarse clock must still count as an edit: move mtime on.
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + bump_ns))


def test_an_edit_is_seen_and_daemon_sections_are_named(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    _write(path, 'default_model = "openai/a"\n', 0)
    watch = ConfigWatch(path, load_settings(path))
    assert watch.current()[0].default_model == "openai/a"
    _write(path, 'default_model = "openai/b"\n', 1_000_000)
    current, changed = watch.current()
    assert current.default_model == "openai/b" and changed == []
    _write(
        path,
        'default_model = "openai/b"\n[sandbox]\ncpus = 1.5\n[nats]\nurl = "nats://x"\n',
        2_000_000,
    )
    current, changed = watch.current()
    assert changed == ["sandbox", "nats"]
    notice = restart_notice(changed, path)
    assert notice is not None and "[sandbox], [nats]" in notice and "daemon restart" in notice
    assert restart_notice([], path) is None
    # the daemon started its MCP servers from the config it read at start
    _write(path, path.read_text() + '[mcp.servers.x]\ncommand = "x"\n', 3_000_000)
    assert watch.current()[1] == ["sandbox", "nats", "mcp"]


def test_a_file_that_no_longer_parses_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    _write(path, 'default_model = "openai/a"\n', 0)
    watch = ConfigWatch(path, load_settings(path))
    _write(path, "this is [not toml\n", 1_000_000)
    with pytest.raises(ConfigError, match="not valid TOML"):
        watch.current()
    _write(path, 'default_model = "openai/c"\n', 2_000_000)  # fixed: read again
    assert watch.current()[0].default_model == "openai/c"


def test_a_deleted_file_means_defaults(tmp_path: Path) -> None:
    path = tmp_path / "config.toml"
    _write(path, 'default_model = "openai/a"\n', 0)
    watch = ConfigWatch(path, load_settings(path))
    path.unlink()
    assert watch.current()[0].default_model is None
