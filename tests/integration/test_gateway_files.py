"""The gateway's files endpoint (orchestrator/sandbox/gateway_files.py) on a real gateway
process started as a pod starts it (TCP port, ``--files-root``), through the host's client
(``pod_files.PodFiles``): a tree goes in and comes back exact (contents, modes, links as
links, nanosecond mtimes); only the shared roots are served, only with the token; nothing is
written outside a root, neither by ``..`` nor through a symlink; a missing path is a 404 the
client reports as False; ``clear`` and ``read_only`` do what they say."""

from __future__ import annotations

import io
import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import httpx
import pytest

from orchestrator.errors import SandboxError
from orchestrator.sandbox.file_tar import FILES_PATH
from orchestrator.sandbox.pod_files import PodFiles
from tests.helpers import pod_gateway

TOKEN: Final = "files-token"
UNAUTHORIZED: Final = 401
FORBIDDEN: Final = 403
BAD_REQUEST: Final = 400
MTIME_NS: Final = 1_700_000_000_123_456_789  # not a float's worth of precision


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    shared, other = tmp_path / "shared", tmp_path / "outside"
    shared.mkdir()
    other.mkdir()
    return shared, other


@pytest.fixture
def gateway(tmp_path: Path, roots: tuple[Path, Path]) -> Iterator[str]:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    with pod_gateway(tmp_path, token_file, "--files-root", str(roots[0])) as url:
        yield url


def make_tree(root: Path) -> None:
    (root / "pkg" / "deep").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("x = 1\n")
    (root / "pkg" / "deep" / "data.bin").write_bytes(bytes(range(256)) * 10)
    (root / "run.sh").write_text("#!/bin/sh\n")
    (root / "run.sh").chmod(0o750)
    (root / "link").symlink_to("pkg/mod.py")
    os.utime(root / "pkg" / "mod.py", ns=(MTIME_NS, MTIME_NS))
    os.mkfifo(root / "fifo")  # not carried


def listing(root: Path) -> dict[str, tuple[str, int, int, str]]:
    """relative path -> (kind, mode, mtime_ns of files, contents or link target)."""
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        rel = str(path.relative_to(root))
        if stat.S_ISLNK(st.st_mode):
            out[rel] = ("l", 0, 0, os.readlink(path))
        elif stat.S_ISDIR(st.st_mode):
            out[rel] = ("d", stat.S_IMODE(st.st_mode), 0, "")
        elif stat.S_ISREG(st.st_mode):
            data = path.read_bytes().hex()
            out[rel] = ("f", stat.S_IMODE(st.st_mode), st.st_mtime_ns, data)
    return out


async def test_a_tree_goes_in_and_comes_back_exact(
    gateway: str, roots: tuple[Path, Path], tmp_path: Path
) -> None:
    shared, _ = roots
    source, back = tmp_path / "source", tmp_path / "back"
    source.mkdir()
    make_tree(source)
    files = PodFiles(gateway, TOKEN)
    await files.push(source, str(shared), "project")
    inside = shared / "project"
    assert listing(inside) == {k: v for k, v in listing(source).items() if k != "fifo"}
    assert not (inside / "fifo").exists()
    assert (inside / "pkg" / "mod.py").stat().st_mtime_ns == MTIME_NS
    assert await files.pull(str(shared), "project", back)
    assert listing(back) == listing(inside)
    # one file by its own name
    assert await files.pull(str(shared), "project/run.sh", tmp_path / "one")
    assert (tmp_path / "one" / "run.sh").read_text() == "#!/bin/sh\n"
    assert not await files.pull(str(shared), "project/missing", tmp_path / "none")


async def test_clear_and_read_only(gateway: str, roots: tuple[Path, Path], tmp_path: Path) -> None:
    shared, _ = roots
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (first / "old.txt").write_text("old")
    (second / "sub").mkdir()
    (second / "sub" / "new.txt").write_text("new")
    files = PodFiles(gateway, TOKEN)
    await files.push(first, str(shared), "skills", read_only=True)
    assert stat.S_IMODE((shared / "skills" / "old.txt").stat().st_mode) & 0o222 == 0
    await files.push(second, str(shared), "skills", clear=True, read_only=True)
    assert sorted(p.name for p in (shared / "skills").rglob("*")) == ["new.txt", "sub"]
    assert stat.S_IMODE((shared / "skills" / "sub").stat().st_mode) & 0o222 == 0


async def test_only_shared_roots_with_the_token_and_nothing_outside(
    gateway: str, roots: tuple[Path, Path], tmp_path: Path
) -> None:
    shared, outside = roots
    source = tmp_path / "source"
    source.mkdir()
    (source / "f.txt").write_text("f")
    with pytest.raises(SandboxError, match="HTTP 401"):
        await PodFiles(gateway, "not-the-token").push(source, str(shared))
    files = PodFiles(gateway, TOKEN)
    with pytest.raises(SandboxError, match="HTTP 403"):
        await files.push(source, str(outside))
    with pytest.raises(SandboxError, match="HTTP 403"):
        await files.pull(str(outside), ".", tmp_path / "x")
    with pytest.raises(SandboxError, match="HTTP 400"):
        await files.push(source, str(shared), "../outside")
    # a directory inside that is a symlink out: neither written through nor read through
    (shared / "escape").symlink_to(outside)
    with pytest.raises(SandboxError, match="HTTP 400"):
        await files.push(source, str(shared), "escape")
    with pytest.raises(SandboxError, match="HTTP 400"):
        await files.pull(str(shared), "escape/f.txt", tmp_path / "y")
    # crafted members: one climbing out, one under the symlink
    for name in ("../outside/evil.txt", "escape/evil.txt", "/tmp/evil.txt"):
        async with httpx.AsyncClient() as http:
            response = await http.put(
                f"{gateway}{FILES_PATH}",
                params={"root": str(shared)},
                headers={"Authorization": f"token {TOKEN}"},
                content=crafted_tar(name),
            )
        assert response.status_code == BAD_REQUEST, name
    assert list(outside.iterdir()) == []


def crafted_tar(name: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(name)
        info.size = 4
        tar.addfile(info, io.BytesIO(b"evil"))
    return buffer.getvalue()
