"""The bwrap sandbox's command line and mount plan (orchestrator/sandbox/bwrap_argv.py)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.sandbox.bwrap_argv import (
    ETC_NETWORK_FILES,
    HOME_TMPFS_BYTES,
    TMP_TMPFS_BYTES,
    Bind,
    BwrapPlan,
    DataFile,
    bwrap_argv,
    group_text,
    host_system_layout,
    passwd_text,
    present_etc_files,
    staged,
)

HOME = "/home/sandbox"
COMMAND = ("/venv/bin/python", "-P", "-m", "orchestrator.sandbox.gateway_main")


def _plan(**changes: object) -> BwrapPlan:
    fields: dict[str, object] = {
        "uid": 1000,
        "gid": 1000,
        "command": COMMAND,
        "chdir": "/work/project",
        "home": HOME,
        "system": {"/bin": "usr/bin", "/lib": None},
        "etc_files": ("/etc/ld.so.cache",),
        "data_files": (DataFile(7, "/etc/passwd"),),
        "binds": (
            Bind("/host/project", "/work/project", writable=True),
            Bind("/venv", "/venv"),
        ),
        "hidden": ("/work/project/.config/prime-agent",),
        "info_fd": 9,
        "unset_env": ("PRIME_AGENT_SANDBOX_OWNER",),
    }
    fields.update(changes)
    return BwrapPlan(**fields)  # type: ignore[arg-type]


def _index(argv: list[str], *seq: str) -> int:
    """Where ``seq`` starts in ``argv`` (it must be there)."""
    for i in range(len(argv) - len(seq) + 1):
        if tuple(argv[i : i + len(seq)]) == seq:
            return i
    raise AssertionError(f"{seq} not in {argv}")


def _options(argv: list[str]) -> list[str]:
    return argv[: argv.index("--")]


def test_every_namespace_is_new_and_every_capability_dropped() -> None:
    argv = bwrap_argv("/usr/bin/bwrap", _plan())
    assert argv[0] == "/usr/bin/bwrap"
    options = _options(argv)
    for flag in (
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-net",
        "--unshare-cgroup-try",
        "--disable-userns",
        "--new-session",
    ):
        assert flag in options, flag
    _index(options, "--cap-drop", "ALL")
    _index(options, "--uid", "1000")
    _index(options, "--gid", "1000")
    _index(options, "--hostname", "sandbox")
    assert "--share-net" not in options and "--die-with-parent" not in options


def test_network_and_die_with_parent_follow_the_plan() -> None:
    options = _options(bwrap_argv("bwrap", _plan(network=True, die_with_parent=True)))
    assert "--unshare-net" not in options
    assert "--die-with-parent" in options


def test_the_command_comes_after_the_separator_unchanged() -> None:
    argv = bwrap_argv("bwrap", _plan())
    assert tuple(argv[argv.index("--") + 1 :]) == COMMAND
    _index(argv, "--chdir", "/work/project", "--")


def test_system_is_read_only_with_symlinks_copied() -> None:
    options = _options(bwrap_argv("bwrap", _plan()))
    _index(options, "--ro-bind", "/usr", "/usr")
    _index(options, "--symlink", "usr/bin", "/bin")
    _index(options, "--ro-bind", "/lib", "/lib")
    _index(options, "--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache")
    _index(options, "--ro-bind-data", "7", "/etc/passwd")
    _index(options, "--proc", "/proc")
    _index(options, "--dev", "/dev")
    # nothing is bound writable but what the plan says
    writable = [options[i + 2] for i, arg in enumerate(options) if arg == "--bind"]
    assert writable == ["/work/project"]


def test_mounts_come_in_the_order_that_keeps_each_visible() -> None:
    options = _options(bwrap_argv("bwrap", _plan()))
    tmp = _index(options, "--size", str(TMP_TMPFS_BYTES), "--perms", "1777", "--tmpfs", "/tmp")
    home = _index(options, "--size", str(HOME_TMPFS_BYTES), "--perms", "0700", "--tmpfs", HOME)
    workspace = _index(options, "--bind", "/host/project", "/work/project")
    venv = _index(options, "--ro-bind", "/venv", "/venv")
    hidden = _index(options, "--tmpfs", "/work/project/.config/prime-agent")
    remount = _index(options, "--remount-ro", "/")
    # a bind may lie under /tmp or home; the venv lies over the workspace; the hidden tmpfs
    # over both; the root is made read-only once everything is in place
    assert tmp < home < workspace < venv < hidden < remount
    _index(options, "--info-fd", "9")
    _index(options, "--unsetenv", "PRIME_AGENT_SANDBOX_OWNER")


def test_staging_replaces_each_source_with_its_own_mount_point(tmp_path: Path) -> None:
    binds = (Bind("/root/venv", "/root/venv"), Bind("/tmp/x/ws", "/tmp/x/ws", writable=True))
    out, pairs = staged(binds, tmp_path / "stage")
    assert pairs == [
        ("/root/venv", str(tmp_path / "stage" / "0")),
        ("/tmp/x/ws", str(tmp_path / "stage" / "1")),
    ]
    assert out == (
        Bind(str(tmp_path / "stage" / "0"), "/root/venv"),
        Bind(str(tmp_path / "stage" / "1"), "/tmp/x/ws", writable=True),
    )


def test_synthesized_identity_files_name_the_sandbox_user() -> None:
    assert passwd_text(1234, 99, HOME) == f"sandbox:x:1234:99:sandbox:{HOME}:/bin/sh\n"
    assert group_text(99) == "sandbox:x:99:\n"


def test_host_layout_tells_symlinks_from_directories(tmp_path: Path) -> None:
    (tmp_path / "usr" / "bin").mkdir(parents=True)
    (tmp_path / "bin").symlink_to("usr/bin")
    (tmp_path / "lib").mkdir()
    entries = [str(tmp_path / name) for name in ("bin", "lib", "lib32")]
    assert host_system_layout(entries) == {
        str(tmp_path / "bin"): "usr/bin",
        str(tmp_path / "lib"): None,
    }


def test_resolv_conf_only_with_the_network() -> None:
    assert not set(ETC_NETWORK_FILES) & set(present_etc_files(network=False))
    with_network = present_etc_files(network=True)
    assert all(Path(name).exists() for name in with_network)
