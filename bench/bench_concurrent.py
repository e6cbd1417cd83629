"""Many sessions at once (issue 18 item 2): N sessions × a few steps through one daemon, next to
the peers run as N processes at once on the same scripted model (``bench/peers.py`` calls this).

Each session's task is ``STEPS`` code steps then a text answer. The scripted model is one
script for everyone, so a session's progress lives in its own REPL: every code step prints
``step N`` from a counter in the kernel, and the script answers once the last message says
``step STEPS`` (rlms, whose last message is its turn number, answers at turn STEPS + 1).
Figures per run:

- step gap: time between a session's consecutive finished steps (its ``tool_result`` events as
  an attached client receives them; for a peer, its own step hook), pooled over sessions;
- first cell: prompt (or process spawn, for a peer) → that session's first finished step;
- wall: first prompt → every session's answer;
- daemon CPU per step: the daemon process's user+system CPU over the run / steps taken (its
  children — gateways and kernels, the sandbox side — are not counted), and the part of it
  spent on the event loop's thread (the rest is the store's writer thread, DuckDB's own
  threads and ``to_thread`` workers);
- model-call workers' CPU per step: the same for the daemon's ``call_worker`` children, when it
  runs any (``model_workers``: docs/models.md), so daemon + workers is the host side's whole.

Sessions are created and their sandboxes started before the clock starts (a warm pool), so the
first cell measures a step on a ready sandbox under load, not sandbox start-up.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from bench import bench_daemon
from bench.common import FakeServerProcess, cli_env, private_xdg
from bench.peer_process import spawn, step_ends
from orchestrator.api.messages import Event, Resync
from orchestrator.models.call_workers import WORKER_MODULE
from orchestrator.sandbox.proctree import children, tree_usage

__all__ = ["STEPS", "ours", "peer_script", "peers"]

STEPS: Final = 5
MS_PER_S: Final = 1000.0
RUN_TIMEOUT_S: Final = 900.0
# A counter kept in the REPL's namespace (smolagents' interpreter refuses ``globals()``).
COUNTER: Final = 'try:\n    n += 1\nexcept NameError:\n    n = 1\nprint(f"step {n}")'
TRAIL_CHARS: Final = 200
CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK")


def _block(text: str, indent: str) -> str:
    return "\n".join(indent + line for line in text.splitlines())


def _code_step(code: str) -> str:
    return f"code:\n{_block(code, '    ')}"


def _fenced_step(code: str) -> str:
    """A ```repl block as rlms reads one."""
    return "text:\n" + _block("```repl\n" + code + "\n```", "    ")


def _when_last(answer: str, step: Callable[[str], str]) -> str:
    """``repeat forever``: answer once the last message says the last step ran, else the next
    step (each step's code differs, or the harness would stop a stuck loop)."""
    branches = [f'    when re "step {STEPS}(?![0-9])":\n{_block(answer, " " * 8)}']
    for k in range(1, STEPS):
        code = _block(step(f"{COUNTER}\n_after = {k}"), " " * 8)
        branches.append(f'    when re "step {k}(?![0-9])":\n{code}')
    fallback = _block(step(COUNTER), " " * 8)
    return "repeat forever:\n" + "\n".join(branches) + f"\n    else:\n{fallback}\n"


def ours_script() -> str:
    return _when_last("text: done", _code_step)


def peer_script(peer: str) -> str:
    if peer == "smolagents":
        return _when_last('code: final_answer("done")', _code_step)
    # rlms ends each request with "Turn K/MAX:" (the REPL output is in an earlier message): its
    # turn number says how far it is.
    answer = _block(_fenced_step('answer["content"] = "done"\nanswer["ready"] = True'), " " * 8)
    return (
        f'repeat forever:\n    when re "Turn {STEPS + 1}/":\n{answer}\n'
        f"    else:\n{_block(_fenced_step(COUNTER), ' ' * 8)}\n"
    )


def _gaps(ends: list[float]) -> list[float]:
    return [(b - a) * MS_PER_S for a, b in itertools.pairwise(ends)]


def _workers_cpu_s(daemon_pid: int) -> float:
    """CPU seconds of the daemon's model-call workers (its children running the module)."""
    total = 0.0
    for child in children(daemon_pid):
        try:
            argv = Path(f"/proc/{child.pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        usage = tree_usage(child.pid) if WORKER_MODULE.encode() in argv else None
        total += usage.cpu_seconds if usage is not None else 0.0
    return total


def _sandboxes_cpu_s(daemon_pid: int) -> float:
    """CPU seconds of the daemon's descendants that are not model-call workers: the sandboxes
    (a kernel gateway and its kernel each, on the local backend)."""
    tree = tree_usage(daemon_pid)
    total = tree.cpu_seconds if tree is not None else 0.0
    return max(0.0, total - _cpu_s(daemon_pid) - _workers_cpu_s(daemon_pid))


def _cpu_s(pid: int, thread: int | None = None) -> float:
    """CPU seconds of process ``pid``, or of its thread ``thread`` (the main thread: ``pid``)."""
    stat = Path(f"/proc/{pid}/stat" if thread is None else f"/proc/{pid}/task/{thread}/stat")
    fields = stat.read_text().rsplit(")", 1)[1].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14, 15 of proc(5)
    return (utime + stime) / CLOCK_TICKS


# --- peers ---------------------------------------------------------------------------------------


def peers(peer: str, sessions: int, base: Path) -> dict[str, Any]:
    """``sessions`` processes of ``peer`` started at once on one scripted model."""
    with FakeServerProcess(peer_script(peer), base) as srv:
        started = time.monotonic()
        procs = [spawn(peer, srv.url, base) for _ in range(sessions)]
        gaps: list[float] = []
        firsts: list[float] = []
        for proc in procs:
            out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
            ends = step_ends(peer, proc, out, err, STEPS)
            gaps += _gaps(ends)
            firsts.append((ends[0] - started) * MS_PER_S)
        wall = time.monotonic() - started
    return {"gaps_ms": gaps, "first_ms": firsts, "wall_s": wall}


# --- ours ----------------------------------------------------------------------------------------


async def _drive(socket: Path, daemon_pid: int, cwd: Path, sessions: int) -> dict[str, Any]:
    admin = await bench_daemon._client(socket)
    watcher = await bench_daemon._client(socket)
    try:
        ids = [
            (await admin.call("create_session", cwd=str(cwd), model="openai/fake", name=f"c{i}"))[
                "session"
            ]
            for i in range(sessions)
        ]
        async with asyncio.timeout(bench_daemon.SANDBOXES_READY_TIMEOUT_S):
            waiting = list(ids)
            while waiting:
                info = await admin.call("sandbox_info", session=waiting[0])
                if info["sandbox"] is not None and info["sandbox"]["state"] == "running":
                    waiting.pop(0)
                else:
                    await asyncio.sleep(bench_daemon.POLL_S)
        ends: dict[str, list[float]] = {sid: [] for sid in ids}
        trail: dict[str, list[str]] = {sid: [] for sid in ids}
        answered: set[str] = set()
        all_done = asyncio.Event()

        async def watch() -> None:
            seen: set[tuple[str, int]] = set()
            async for message in watcher.events():
                if isinstance(message, Resync):
                    raise RuntimeError("the watching client fell behind (resync)")
                if not isinstance(message, Event) or (message.session, message.cursor) in seen:
                    continue
                seen.add((message.session, message.cursor))
                event, sid = message.event, message.session
                kind = event.get("type")
                trail[sid].append(f"{kind} {str(event.get('payload'))[:TRAIL_CHARS]}")
                answer = kind == "assistant_message" and event["payload"].get("text") == "done"
                if kind == "tool_result" or answer:
                    ends[sid].append(time.monotonic())
                if answer:
                    answered.add(sid)
                    if len(answered) == len(ids):
                        all_done.set()
                        return

        for sid in ids:
            await watcher.call("attach", session=sid, cursor=0)
        task = asyncio.create_task(watch())
        cpu_before = _cpu_s(daemon_pid)
        loop_before = _cpu_s(daemon_pid, thread=daemon_pid)  # the daemon's loop is its main thread
        workers_before = _workers_cpu_s(daemon_pid)
        sandboxes_before = _sandboxes_cpu_s(daemon_pid)
        started = time.monotonic()
        await asyncio.gather(*(admin.call("prompt", session=sid, text="go") for sid in ids))
        async with asyncio.timeout(RUN_TIMEOUT_S):
            await all_done.wait()
        wall = time.monotonic() - started
        cpu = _cpu_s(daemon_pid) - cpu_before
        loop_cpu = _cpu_s(daemon_pid, thread=daemon_pid) - loop_before
        workers_cpu = _workers_cpu_s(daemon_pid) - workers_before
        sandboxes_cpu = _sandboxes_cpu_s(daemon_pid) - sandboxes_before
        task.cancel()
        short = [sid for sid, e in ends.items() if len(e) != STEPS + 1]
        if short:
            counts = sorted(len(ends[sid]) for sid in short)
            for sid in short:  # what those sessions did, for whoever reads the failure
                print(f"{sid}:\n  " + "\n  ".join(trail[sid]))
            raise RuntimeError(f"{len(short)} sessions did not take {STEPS + 1} steps: {counts}")
        return {
            "gaps_ms": [g for e in ends.values() for g in _gaps(e)],
            "first_ms": [(e[0] - started) * MS_PER_S for e in ends.values()],
            "wall_s": wall,
            "cpu_per_step_ms": cpu / (sessions * (STEPS + 1)) * MS_PER_S,
            "loop_cpu_per_step_ms": loop_cpu / (sessions * (STEPS + 1)) * MS_PER_S,
            "workers_cpu_per_step_ms": workers_cpu / (sessions * (STEPS + 1)) * MS_PER_S,
            "sandboxes_cpu_per_step_ms": sandboxes_cpu / (sessions * (STEPS + 1)) * MS_PER_S,
        }
    finally:
        await watcher.close()
        await admin.close()


def ours(sessions: int, base: Path, model_workers: int | None = None) -> dict[str, Any]:
    """``sessions`` sessions through one daemon (local backend, as the peers run their REPL);
    ``model_workers``: the daemon's ``[daemon] model_workers`` (None: the machine decides)."""
    with FakeServerProcess(ours_script(), base) as fake, private_xdg(base) as xdg:
        env = cli_env(xdg)
        env["PRIME_AGENT_BACKEND"] = "local"
        config = Path(xdg["XDG_CONFIG_HOME"]) / "prime-agent" / "config.toml"
        config.parent.mkdir(parents=True, exist_ok=True)
        workers = "" if model_workers is None else f"[daemon]\nmodel_workers = {model_workers}\n"
        config.write_text(f'{workers}[models."openai/fake"]\napi_base = "{fake.url}"\n')
        socket = bench_daemon._socket(env)
        with bench_daemon._daemon(env) as daemon:
            return asyncio.run(_drive(socket, daemon.pid, base, sessions))
