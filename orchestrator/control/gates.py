"""One autonomous gate run (``--autonomous-gate CMD``), inside the session's sandbox.

A gate is a shell command the agent must satisfy before an autonomous run may finish
(docs/control.md). It runs where the agent's own code runs: in the session's kernel, through
``Sandbox.execute``, with the session's workspace as its working directory. That needs nothing
but the kernel, so it works the same for every backend (local, docker, kubernetes), and the
command never runs on the host (where a docker or kubernetes session's tools are not, and which
the sandbox exists to protect).

The cell is a small Python program (``_KERNEL_SOURCE``) run with ``exec`` in a namespace of its
own, so the agent's variables are neither read nor changed. It starts the command with
``shell=True`` in ``cwd`` as the leader of a new session (``start_new_session``), reads its
stdout and stderr together from one pipe on a thread, keeping at most ``CAPTURE_MAX_BYTES`` (the
first half and a rolling last half; what falls between is counted, not kept), and waits up to
the timeout. Then, whatever happened (done, timed out, or the cell interrupted), what is left of
the process group is stopped the Trio way: SIGTERM, ``KILL_GRACE_S``, SIGKILL, so a gate never
leaves a server or a ``sleep`` behind. It prints exactly one line: ``GATE_REPORT_MARKER`` and a
JSON report (``exit_code``, ``timed_out``, ``error``, ``head``, ``tail``, ``missing``,
``dropped_bytes``, ``duration_ms``). The report carries at most ``GATE_OUTPUT_MAX_CHARS`` of the
output's head and of its tail, which is all the bounded text can show, so the line stays well
within a cell's output cap; were it cut anyway, the cell's full-output artifact (written on the
host whenever something is cut) is read instead.

The host parses the report and bounds the output with ``bound_gate_output`` after cleaning it
like any cell output (ANSI escapes, control characters, ``\\r`` progress lines). A cell that
printed no report (the kernel died, the cell timed out, the sandbox is unusable) is a failed
gate whose output is the cell's error text.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from orchestrator.control.workspace_hash import GATE_OUTPUT_MAX_CHARS, bound_gate_output
from orchestrator.errors import SandboxError
from orchestrator.sandbox.base import CellResult, Sandbox
from orchestrator.sandbox.output import clean_text

__all__ = [
    "CAPTURE_MAX_BYTES",
    "EXECUTE_SLACK_S",
    "GATE_REPORT_MARKER",
    "KILL_GRACE_S",
    "GateRun",
    "gate_cell_code",
    "parse_gate_report",
    "run_gate",
]

# Output kept while a gate runs (stdout and stderr together): the first half and the last half.
CAPTURE_MAX_BYTES: Final = 1024 * 1024
# Between SIGTERM and SIGKILL of the gate's process group.
KILL_GRACE_S: Final = 2.0
# The cell may take this much longer than the gate's own timeout and grace (starting Python
# threads, printing the report) before the sandbox interrupts it.
EXECUTE_SLACK_S: Final = 30.0
# Starts the report line. Gate output never reaches the cell's stdout raw (it travels inside
# the JSON string, newlines escaped), so no gate can print a line that looks like a report.
GATE_REPORT_MARKER: Final = "__prime_agent_gate_report__ "
# The artifact holds one cell's full output; ours is one short line, so this is generous.
_ARTIFACT_READ_MAX_BYTES: Final = 4 * 1024 * 1024


@dataclass(frozen=True)
class GateRun:
    """What one gate run did. ``exit_code`` None: it timed out or could not start (or the
    cell failed); ``output`` is bounded (``GATE_OUTPUT_MAX_CHARS``)."""

    exit_code: int | None
    output: str
    timed_out: bool
    duration_ms: float

    @property
    def passed(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


# Runs in the kernel as its own module (``exec`` with fresh globals holding ARGS, a JSON text).
_KERNEL_SOURCE: Final = r'''
import json, os, signal, subprocess, threading, time


def _group_alive(pgid):
    """A process of the group that is not a zombie exists. Orphans go to a reaper that may
    take its time, and a zombie would answer killpg(pgid, 0) for the whole grace."""
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        names = os.listdir("/proc")
    except OSError:
        return True
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == b"%d" % pgid and fields[0] != b"Z":
            return True
    return False


def _stop_group(proc, grace_s):
    """SIGTERM the group, wait up to grace_s for it to be gone, then SIGKILL it."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        proc.poll()  # reap the leader, or its zombie keeps the group alive
        if not _group_alive(proc.pid):
            return
        time.sleep(0.02)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.poll()


def _main(args):
    started = time.monotonic()
    keep = args["keep_chars"]
    report = {"exit_code": None, "timed_out": False, "error": None, "head": "", "tail": "",
              "missing": 0, "dropped_bytes": 0, "duration_ms": 0.0}
    try:
        proc = subprocess.Popen(
            args["command"], shell=True, cwd=args["cwd"], stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    except (OSError, ValueError) as exc:
        report["error"] = "could not start the gate: %s" % (exc,)
        report["duration_ms"] = (time.monotonic() - started) * 1000.0
        return report
    half = args["capture_bytes"] // 2
    head, tail, dropped, lock = bytearray(), bytearray(), [0], threading.Lock()

    def read():
        fd = proc.stdout.fileno()
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            with lock:
                room = half - len(head)
                if room > 0:
                    head.extend(chunk[:room])
                    chunk = chunk[room:]
                tail.extend(chunk)
                over = len(tail) - half
                if over > 0:
                    del tail[:over]
                    dropped[0] += over

    reader = threading.Thread(target=read, name="prime-agent-gate-reader", daemon=True)
    reader.start()
    try:
        try:
            proc.wait(timeout=args["timeout_s"])
        except subprocess.TimeoutExpired:
            report["timed_out"] = True
    finally:
        # Done, timed out or interrupted: nothing of the group outlives the gate.
        _stop_group(proc, args["kill_grace_s"])
    # The pipe closes once every writer is gone; one that left the group (setsid) may keep it
    # open, so do not wait for it longer than the grace (the daemon thread ends with the pipe).
    reader.join(args["kill_grace_s"])
    try:
        proc.wait(timeout=args["kill_grace_s"])  # only a member we may not signal can block it
    except subprocess.TimeoutExpired:
        pass
    report["duration_ms"] = (time.monotonic() - started) * 1000.0
    if not report["timed_out"]:
        report["exit_code"] = proc.returncode
    with lock:
        head_b, tail_b, report["dropped_bytes"] = bytes(head), bytes(tail), dropped[0]
    if report["dropped_bytes"]:
        head_t = head_b.decode("utf-8", "replace")
        tail_t = tail_b.decode("utf-8", "replace")
        report["head"], report["tail"] = head_t[:keep], tail_t[-keep:]
        report["missing"] = max(0, len(head_t) - keep) + max(0, len(tail_t) - keep)
    else:
        text = (head_b + tail_b).decode("utf-8", "replace")
        if len(text) <= 2 * keep:
            report["head"] = text
        else:
            report["head"], report["tail"] = text[:keep], text[-keep:]
            report["missing"] = len(text) - 2 * keep
    return report


print("\n" + MARKER + json.dumps(_main(json.loads(ARGS)), ensure_ascii=False), flush=True)
'''


def gate_cell_code(
    command: str,
    *,
    cwd: str,
    timeout_s: float,
    kill_grace_s: float = KILL_GRACE_S,
    capture_bytes: int = CAPTURE_MAX_BYTES,
    keep_chars: int = GATE_OUTPUT_MAX_CHARS,
) -> str:
    """The cell that runs ``command`` in the kernel and prints its report line."""
    args = json.dumps(
        {
            "command": command,
            "cwd": cwd,
            "timeout_s": timeout_s,
            "kill_grace_s": kill_grace_s,
            "capture_bytes": capture_bytes,
            "keep_chars": keep_chars,
        }
    )
    namespace = {"__name__": "__prime_agent_gate__", "ARGS": args, "MARKER": GATE_REPORT_MARKER}
    return f"exec({_KERNEL_SOURCE!r}, {namespace!r})\n"


def parse_gate_report(text: str) -> dict[str, Any] | None:
    """The last report in a cell's output (``GATE_REPORT_MARKER`` at the start of a line,
    then a JSON object), or None when there is none that parses."""
    decoder = json.JSONDecoder()
    end = len(text)
    while (at := text.rfind(GATE_REPORT_MARKER, 0, end)) >= 0:
        end = at
        if at > 0 and text[at - 1] != "\n":
            continue
        try:
            report, _ = decoder.raw_decode(text, at + len(GATE_REPORT_MARKER))
        except ValueError:
            continue
        if isinstance(report, dict):
            return report
    return None


def _read_artifact(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        with path.open("rb") as fh:
            return fh.read(_ARTIFACT_READ_MAX_BYTES).decode("utf-8", "replace")
    except OSError:
        return ""


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _report_output(report: dict[str, Any]) -> str:
    """The report's output, cleaned and bounded. ``missing`` characters between head and tail
    are stood in for by spaces: ``bound_gate_output`` shows at most half its limit from each
    end, which the head and tail (``GATE_OUTPUT_MAX_CHARS`` each) cover, so only the length of
    what was cut reaches the marker it writes."""
    head = clean_text(str(report.get("head") or ""))
    tail = clean_text(str(report.get("tail") or ""))
    missing = _int_or_none(report.get("missing")) or 0
    text = head + " " * min(max(missing, 0), CAPTURE_MAX_BYTES) + tail
    dropped = _int_or_none(report.get("dropped_bytes")) or 0
    if dropped > 0:
        text = f"[output over {CAPTURE_MAX_BYTES} bytes: {dropped} bytes were not kept]\n" + text
    error = report.get("error")
    if error:
        text = f"{error}\n{text}" if text else str(error)
    return bound_gate_output(text)


def _cell_failure(result: CellResult) -> str:
    """What a cell that printed no report says about why."""
    parts = [f"the gate did not report (cell {result.status})"]
    if result.notice:
        parts.append(result.notice)
    if result.error is not None:
        parts.append(result.error.traceback or f"{result.error.ename}: {result.error.evalue}")
    for stream in (result.stderr, result.stdout):
        if stream.strip():
            parts.append(stream.strip())
    return clean_text("\n".join(parts))


async def run_gate(
    sandbox: Sandbox, command: str, *, cwd: str, timeout_s: float, cell_id: str
) -> GateRun:
    """Run ``command`` in ``sandbox`` (working directory ``cwd`` as the kernel sees it) for at
    most ``timeout_s`` seconds; never raises for the command, the cell or the sandbox failing
    (those are failed gates)."""
    if timeout_s <= 0:
        raise ValueError("timeout_s must be positive")
    code = gate_cell_code(command, cwd=cwd, timeout_s=timeout_s)
    started = time.monotonic()
    try:
        result = await sandbox.execute(
            code, timeout_s=timeout_s + KILL_GRACE_S * 2 + EXECUTE_SLACK_S, cell_id=cell_id
        )
    except SandboxError as exc:
        elapsed = (time.monotonic() - started) * 1000.0
        return GateRun(
            exit_code=None,
            output=bound_gate_output(f"the sandbox could not run the gate: {exc}"),
            timed_out=False,
            duration_ms=elapsed,
        )
    elapsed = (time.monotonic() - started) * 1000.0
    report = parse_gate_report(result.stdout)
    if report is None and result.truncated_chars:
        report = parse_gate_report(_read_artifact(result.artifact_path))
    if report is None:
        return GateRun(
            exit_code=None,
            output=bound_gate_output(_cell_failure(result)),
            timed_out=result.status == "timeout",
            duration_ms=elapsed,
        )
    duration = report.get("duration_ms")
    return GateRun(
        exit_code=_int_or_none(report.get("exit_code")),
        output=_report_output(report),
        timed_out=report.get("timed_out") is True,
        duration_ms=float(duration) if isinstance(duration, int | float) else elapsed,
    )
