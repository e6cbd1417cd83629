"""Bounded, cleaned cell output: orchestrator.sandbox.output."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.sandbox.output import (
    ARTIFACT_SUBDIR,
    LIVE_OUTPUT_MAX_CHARS,
    MAX_PENDING_LINE_CHARS,
    BoundedText,
    OutputCollector,
    StreamCleaner,
    artifact_path_for,
    clean_text,
    truncation_marker,
)

CAP = 1000


def collector(tmp_path: Path, cap: int = CAP) -> OutputCollector:
    return OutputCollector(cap_chars=cap, artifact_path=artifact_path_for(tmp_path, "cell-1"))


def feed_chunks(text: str, size: int) -> str:
    cleaner = StreamCleaner()
    out = [cleaner.feed(text[i : i + size]) for i in range(0, len(text), size)]
    return "".join(out) + cleaner.flush()


# --- cleaning --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("plain\n", "plain\n"),
        ("\x1b[31mred\x1b[0m\n", "red\n"),
        ("\x1b[1;38;5;208mfancy\x1b[K\n", "fancy\n"),
        ("\x1b]0;window title\x07after\n", "after\n"),
        ("\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\\n", "link\n"),
        ("\x1b(Bcharset\x1b=\n", "charset\n"),
        ("nul\x00 bell\x07 bs\x08 vt\x0b ff\x0c del\x7f c1\x9b\n", "nul bell bs vt ff del c1\n"),
        ("tab\tkept\n", "tab\tkept\n"),
        ("surrogate \udcff here\n", "surrogate \ufffd here\n"),
        ("crlf\r\nline\r\n", "crlf\nline\n"),
        ("10%\r50%\r100%\n", "100%\n"),
        ("no newline at end", "no newline at end"),
        ("progress\r", "progress"),
        ("lone escape \x1b", "lone escape "),
    ],
)
def test_clean_text(raw: str, clean: str) -> None:
    assert clean_text(raw) == clean


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_cleaning_is_the_same_whatever_the_chunking(size: int) -> None:
    raw = "a\x1b[31mred\x1b[0m\r\nb 10%\r20%\r\x1b]0;t\x07done\r\nlast"
    assert feed_chunks(raw, size) == clean_text(raw) == "ared\ndone\nlast"


@given(st.text(alphabet=st.sampled_from(list("ab\n\r\t\x1b[]0;m\x07\\\x00")), max_size=200))
def test_cleaned_text_has_no_control_characters(raw: str) -> None:
    for size in (1, 5, 1000):
        out = feed_chunks(raw, size)
        assert not any(ord(ch) < 32 and ch not in "\n\t" for ch in out)
        assert "\x7f" not in out


def test_pending_line_is_bounded() -> None:
    cleaner = StreamCleaner()
    out = cleaner.feed("x" * (3 * MAX_PENDING_LINE_CHARS))
    assert len(out) == 3 * MAX_PENDING_LINE_CHARS  # committed, not held back


# --- bounding --------------------------------------------------------------------------------


def test_bounded_text_under_cap_is_untouched() -> None:
    bounded = BoundedText(CAP)
    for _ in range(10):
        bounded.add("y" * 100)
    assert bounded.text() == ("y" * 1000, 0)


@pytest.mark.parametrize("chunk", [1, 37, 499, 5000])
def test_bounded_text_keeps_head_and_tail_within_cap(chunk: int) -> None:
    total = 20_000
    data = "".join(f"{i:05d}\n" for i in range(total // 6))
    bounded = BoundedText(CAP)
    for i in range(0, len(data), chunk):
        bounded.add(data[i : i + chunk])
    text, cut = bounded.text()
    assert len(text) <= CAP
    assert cut == len(data) - (len(text) - len(truncation_marker(cut)))
    head, tail = text.split(truncation_marker(cut))
    assert data.startswith(head) and data.endswith(tail)
    assert len(head) > CAP // 3 and len(tail) > CAP // 3


def test_bounded_text_memory_is_bounded() -> None:
    bounded = BoundedText(CAP)
    for _ in range(10_000):
        bounded.add("z" * 333)
    assert sum(len(part) for part in bounded._tail) < CAP
    assert bounded._head_len <= CAP // 2


def test_tiny_cap_is_refused() -> None:
    with pytest.raises(ValueError):
        BoundedText(10)


# --- collector and artifact ----------------------------------------------------------------


def test_collector_without_cut_writes_no_artifact(tmp_path: Path) -> None:
    out = collector(tmp_path)
    out.add("stdout", "hello\n")
    out.add("stderr", "\x1b[33mwarn\x1b[0m\n")
    out.add_block("result", "42")
    out.add_block("display", "'a'")
    out.add_block("display", "'b'")
    result = out.result("ok", duration_ms=5.0)
    assert (result.stdout, result.stderr, result.result, result.display) == (
        "hello\n",
        "warn\n",
        "42",
        "'a'\n'b'",
    )
    assert result.truncated_chars == 0
    assert result.artifact_path is None
    assert not (tmp_path / ARTIFACT_SUBDIR).exists()


def test_collector_cut_writes_everything_to_artifact(tmp_path: Path) -> None:
    out = collector(tmp_path)
    out.add("stderr", "early warning\n")
    lines = [f"line {i}\n" for i in range(5000)]
    for line in lines:
        out.add("stdout", line)
    out.add("stderr", "late \x1b[31merror\x1b[0m\n")
    out.set_error("RuntimeError", "bad", ["Traceback:", "\x1b[31mRuntimeError: bad\x1b[0m"])
    result = out.result("error")
    assert len(result.stdout) <= CAP
    assert "[... truncated " in result.stdout
    assert result.stdout.startswith("line 0\n") and result.stdout.endswith("line 4999\n")
    assert result.stderr == "early warning\nlate error\n"
    assert result.error is not None
    assert result.error.traceback == "Traceback:\nRuntimeError: bad"
    assert result.truncated_chars == len("".join(lines)) - (
        len(result.stdout) - len(truncation_marker(result.truncated_chars))
    )
    assert result.artifact_path == tmp_path / ARTIFACT_SUBDIR / "cell-1.txt"
    saved = result.artifact_path.read_text()
    # Everything, in order, cleaned, with a header whenever the stream changes.
    assert saved.startswith("===== stderr =====\nearly warning\n===== stdout =====\nline 0\n")
    assert "".join(lines) in saved
    assert "\n===== stderr =====\nlate error\n" in saved
    assert saved.endswith("===== traceback =====\nTraceback:\nRuntimeError: bad")


def test_collector_memory_does_not_grow_with_output(tmp_path: Path) -> None:
    out = collector(tmp_path, cap=64 * 1024)
    chunk = "0123456789" * 1000 + "\n"  # 10 KB
    tracemalloc.start()
    try:
        for _ in range(2000):  # 20 MB in total
            out.add("stdout", chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    result = out.result("ok")
    assert peak < 2 * 1024 * 1024
    assert result.artifact_path is not None
    assert result.artifact_path.stat().st_size == 2000 * len(chunk) + len("===== stdout =====\n")


def test_error_value_is_bounded(tmp_path: Path) -> None:
    out = collector(tmp_path)
    out.set_error("ValueError", "v" * 10_000, ["ValueError: " + "v" * 10_000])
    result = out.result("error")
    assert result.error is not None
    assert len(result.error.evalue) <= CAP
    assert len(result.error.traceback) <= CAP
    assert result.truncated_chars > 18_000


def test_notes_join_the_notice(tmp_path: Path) -> None:
    out = collector(tmp_path)
    out.note("[an output message over 16 MiB was dropped]")
    result = out.result("ok", notice="cell timed out.")
    assert result.notice == "cell timed out. [an output message over 16 MiB was dropped]"


def test_artifact_write_failure_does_not_fail_the_cell(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    out = OutputCollector(cap_chars=CAP, artifact_path=blocker / "outputs" / "c.txt")
    out.add("stdout", "x" * (3 * CAP))
    result = out.result("ok")
    assert len(result.stdout) <= CAP
    assert result.artifact_path is None
    assert "could not be saved" in result.notice


@pytest.mark.parametrize(
    ("cell_id", "name"),
    [
        ("call_abc-1.2", "call_abc-1.2.txt"),
        ("../../etc/passwd", "_.._etc_passwd.txt"),
        ("", "cell.txt"),
    ],
)
def test_artifact_path_is_confined(tmp_path: Path, cell_id: str, name: str) -> None:
    path = artifact_path_for(tmp_path, cell_id)
    assert path.parent == tmp_path / ARTIFACT_SUBDIR
    assert path.name == name


# --- streams the kernel spilled to a file (orchestrator/runtime/spill.py) --------------------


def _spill_record(path: Path, chars: int, skipped: int) -> dict[str, object]:
    return {"path": str(path), "chars": chars, "bytes": chars, "skipped": skipped}


def test_collector_asks_the_kernel_to_spill_next_to_its_artifact(tmp_path: Path) -> None:
    c = collector(tmp_path)
    request = c.spill_request()
    assert request["dir"] == str(tmp_path / ARTIFACT_SUBDIR) and request["cell"] == "cell-1"
    assert request["tail"] == CAP and int(request["after"]) >= CAP


def test_a_spilled_stream_names_its_file_and_the_file_is_the_artifact(tmp_path: Path) -> None:
    c = collector(tmp_path)
    spill_file = tmp_path / ARTIFACT_SUBDIR / "cell-1.stdout.txt"
    spill_file.parent.mkdir(parents=True)
    spill_file.write_text("h" * 5000 + "m" * 90_000 + "t" * 5000)
    c.add("stdout", "h" * 5000)  # the head the kernel sent
    c.spilled("stdout", _spill_record(spill_file, 100_000, 90_000 + 5000 - CAP))
    c.add("stdout", "t" * CAP)  # the tail it sent with the record
    c.add("stderr", "small\n")
    r = c.result("ok")
    assert r.stdout.startswith("h" * 100) and r.stdout.endswith("t" * 100)
    assert len(r.stdout) <= CAP + 200  # the marker carries the path
    assert f"all 100000 chars of stdout (100000 bytes) are in {spill_file}" in r.stdout
    assert r.stderr == "small\n"
    assert r.artifact_path == spill_file and r.artifact_bytes == 100_000
    assert r.truncated_chars >= 100_000 - CAP - 200
    # the collector's own file would only be a partial copy: it is gone
    assert not artifact_path_for(tmp_path, "cell-1").exists()


def test_own_artifact_kept_when_another_stream_overflowed_too(tmp_path: Path) -> None:
    c = collector(tmp_path)
    spill_file = tmp_path / "cell-1.stdout.txt"
    c.add("stdout", "h" * 2000)
    c.spilled("stdout", _spill_record(spill_file, 50_000, 47_000))
    c.add("stdout", "t" * CAP)
    c.add("stderr", "e" * 3000)  # cut by the host, not spilled
    r = c.result("ok")
    own = artifact_path_for(tmp_path, "cell-1")
    assert r.artifact_path == own and r.artifact_bytes == own.stat().st_size
    text = own.read_text()
    assert "e" * 3000 in text and f"are in {spill_file}" in text  # points at the spill


def test_a_malformed_spill_record_is_ignored(tmp_path: Path) -> None:
    c = collector(tmp_path)
    c.add("stdout", "fine\n")
    c.spilled("stdout", {"path": "/x", "chars": "many"})
    r = c.result("ok")
    assert r.stdout == "fine\n" and r.artifact_path is None


def test_a_spilled_block_is_head_marker_tail(tmp_path: Path) -> None:
    c = collector(tmp_path, cap=4000)
    spill_file = tmp_path / "cell-1.result.txt"
    record = {"path": str(spill_file), "chars": 50_000, "bytes": 50_000, "skipped": 49_000}
    c.add_block("result", "h" * 500 + "t" * 500, {**record, "head": 500})
    r = c.result("ok")
    head, _, tail = r.result.partition("\n[... truncated ")
    assert head == "h" * 500 and tail.endswith("\n" + "t" * 500)
    assert f"of result (50000 bytes) are in {spill_file}" in r.result
    assert r.artifact_path == spill_file and r.artifact_bytes == 50_000


def test_a_live_listener_sees_the_cleaned_output_up_to_its_bound(tmp_path: Path) -> None:
    seen: list[tuple[str, str]] = []
    collector = OutputCollector(
        cap_chars=CAP,
        artifact_path=artifact_path_for(tmp_path, "cell-live"),
        listener=lambda stream, text: seen.append((stream, text)),
    )
    collector.add("stdout", "a\x1b[31mred\x1b[0m\n")
    collector.add("stderr", "warn\n")
    assert seen == [("stdout", "ared\n"), ("stderr", "warn\n")]
    # Past LIVE_OUTPUT_MAX_CHARS the listener hears nothing more; the result is bounded by the
    # cap, not by the listener.
    collector.add("stdout", "x" * (LIVE_OUTPUT_MAX_CHARS * 2) + "\n")
    assert sum(len(text) for _, text in seen) == LIVE_OUTPUT_MAX_CHARS
    collector.add("stdout", "more\n")
    assert sum(len(text) for _, text in seen) == LIVE_OUTPUT_MAX_CHARS
    collector.close()


def test_a_failing_listener_is_dropped_and_the_cell_goes_on(tmp_path: Path) -> None:
    calls: list[str] = []

    def broken(stream: str, text: str) -> None:
        calls.append(text)
        raise RuntimeError("the view broke")

    collector = OutputCollector(
        cap_chars=1000, artifact_path=artifact_path_for(tmp_path, "cell-x"), listener=broken
    )
    collector.add("stdout", "one\n")
    collector.add("stdout", "two\n")
    assert calls == ["one\n"]
    result = collector.result("ok", duration_ms=1.0)
    assert result.stdout == "one\ntwo\n"
    collector.close()
