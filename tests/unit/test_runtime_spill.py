"""The kernel side of output spilling: orchestrator.runtime.spill (no kernel needed)."""

from __future__ import annotations

from pathlib import Path

from orchestrator.runtime.spill import _StreamSpill, _Tail, spill_path


def test_spill_path_is_confined() -> None:
    assert spill_path("/o", "../../etc/x", "stdout") == "/o/_.._etc_x.stdout.txt"
    assert spill_path("/o", "c-1", "stderr") == "/o/c-1.stderr.txt"


def test_tail_keeps_the_last_characters() -> None:
    tail = _Tail(10)
    for piece in ["abc", "defgh", "ijklmnop", "q"]:
        tail.add(piece)
    assert tail.text() == "hijklmnopq"
    tail.add("z" * 50)
    assert tail.text() == "z" * 10


def test_under_the_threshold_everything_is_sent(tmp_path: Path) -> None:
    sent: list[str] = []
    spill = _StreamSpill(str(tmp_path / "c.stdout.txt"), after=100, tail=10)
    spill.write("a" * 60, sent.append)
    spill.write("b" * 40, sent.append)
    assert "".join(sent) == "a" * 60 + "b" * 40
    assert spill.close() is None and not (tmp_path / "c.stdout.txt").exists()


def test_past_the_threshold_the_file_gets_everything_and_only_head_and_tail_go_out(
    tmp_path: Path,
) -> None:
    sent: list[str] = []
    path = tmp_path / "out" / "c.stdout.txt"
    spill = _StreamSpill(str(path), after=100, tail=10)
    writes = ["a" * 60, "b" * 1000, "c" * 5, "\udcff" + "d" * 20]
    for text in writes:
        spill.write(text, sent.append)
    assert "".join(sent) == "a" * 60 + "b" * 40  # the head: exactly ``after`` characters
    record = spill.close()
    assert record is not None
    assert path.read_bytes() == "".join(writes).encode("utf-8", "backslashreplace")
    assert record["path"] == str(path) and record["bytes"] == path.stat().st_size
    assert record["chars"] == sum(map(len, writes))
    assert record["tail"] == "d" * 10
    assert record["skipped"] == record["chars"] - 100 - 10


def test_a_file_that_cannot_be_written_falls_back_to_sending(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    sent: list[str] = []
    spill = _StreamSpill(str(blocker / "sub" / "c.stdout.txt"), after=10, tail=5)
    spill.write("x" * 30, sent.append)
    spill.write("y" * 3, sent.append)
    assert "".join(sent) == "x" * 30 + "y" * 3  # nothing twice, nothing lost
    assert spill.close() is None


def test_a_cut_error_text_fits_the_cap_with_its_pointer() -> None:
    from orchestrator.runtime.spill import _cut

    cut = _cut("v" * 100_000, 500, "the whole traceback (1 bytes) is in /o/c.traceback.txt")
    assert len(cut) <= 500 and cut.startswith("vvv") and cut.endswith("vvv")
    assert "/o/c.traceback.txt" in cut
    assert _cut("short", 500, "p") == "short"
