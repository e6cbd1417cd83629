"""``file_tar``: trees to tar streams and back (the gateway's files endpoint, both sides).

Exact nanosecond mtimes (the workspace sync-back compares them); links stay links; the size
bound holds on both sides; no member lands outside its destination, whether by ``..``, an
absolute name, a symlinked parent or a kind that is not carried (hard links, devices)."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path
from typing import Final

import pytest

from orchestrator.errors import SandboxError
from orchestrator.sandbox.file_tar import clear_dir, pack, unpack

MTIME_NS: Final = 1_650_000_000_987_654_321
SMALL_LIMIT: Final = 100


def packed(source: Path, **options: int) -> io.BytesIO:
    buffer = io.BytesIO()
    pack(source, buffer, **options)
    buffer.seek(0)
    return buffer


def test_a_tree_round_trips_with_exact_mtimes_and_links(tmp_path: Path) -> None:
    source, dest = tmp_path / "src", tmp_path / "dest"
    (source / "a" / "b").mkdir(parents=True)
    dest.mkdir()
    (source / "a" / "b" / "f.txt").write_text("data")
    os.utime(source / "a" / "b" / "f.txt", ns=(MTIME_NS, MTIME_NS))
    (source / "a" / "f.link").symlink_to("b/f.txt")
    (source / "x.sh").write_text("#!/bin/sh\n")
    (source / "x.sh").chmod(0o751)
    assert unpack(packed(source), dest) == len("data") + len("#!/bin/sh\n")
    assert (dest / "a" / "b" / "f.txt").stat().st_mtime_ns == MTIME_NS
    assert os.readlink(dest / "a" / "f.link") == "b/f.txt"
    assert (dest / "x.sh").stat().st_mode & 0o777 == 0o751


def test_the_size_bound_holds_on_both_sides(tmp_path: Path) -> None:
    source, dest = tmp_path / "src", tmp_path / "dest"
    source.mkdir()
    dest.mkdir()
    (source / "big").write_bytes(b"x" * (SMALL_LIMIT + 1))
    with pytest.raises(SandboxError, match="more than"):
        packed(source, max_bytes=SMALL_LIMIT)
    with pytest.raises(SandboxError, match="more than"):
        unpack(packed(source), dest, max_bytes=SMALL_LIMIT)


def crafted(*members: tarfile.TarInfo) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info in members:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isreg() else None)
    buffer.seek(0)
    return buffer


def member(name: str, kind: bytes = tarfile.REGTYPE, **fields: object) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = 1 if kind == tarfile.REGTYPE else 0
    for key, value in fields.items():
        setattr(info, key, value)
    return info


@pytest.mark.parametrize(
    "members",
    [
        (member("../escape"),),
        (member("/abs"),),
        (member("link", tarfile.SYMTYPE, linkname="../outside"), member("link/escape")),
        (member("hard", tarfile.LNKTYPE, linkname="x"),),
        (member("dev", tarfile.CHRTYPE),),
    ],
    ids=["dotdot", "absolute", "through-a-link", "hard-link", "device"],
)
def test_nothing_lands_outside_and_only_three_kinds_are_carried(
    tmp_path: Path, members: tuple[tarfile.TarInfo, ...]
) -> None:
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    dest.mkdir()
    outside.mkdir()
    with pytest.raises(SandboxError):
        unpack(crafted(*members), dest)
    assert list(outside.iterdir()) == []
    assert not (tmp_path / "escape").exists()


def test_read_only_takes_the_write_bits_and_clear_dir_undoes_it(tmp_path: Path) -> None:
    source, dest = tmp_path / "src", tmp_path / "dest"
    (source / "pkg").mkdir(parents=True)
    dest.mkdir()
    (source / "pkg" / "m.py").write_text("x = 1\n")
    unpack(packed(source), dest, read_only=True)
    assert (dest / "pkg").stat().st_mode & 0o222 == 0
    assert (dest / "pkg" / "m.py").stat().st_mode & 0o222 == 0
    clear_dir(dest)
    assert list(dest.iterdir()) == []
