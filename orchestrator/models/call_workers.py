"""Model-call worker processes: a daemon's OpenAI-compatible streams parsed off its loop.

Every session of a daemon shares its event loop, and reading a model's stream (HTTP, SSE,
one JSON chunk per token) was the largest part of a step's loop CPU. With ``[daemon]
model_workers`` above 0 the daemon starts that many ``call_worker`` processes and hands them
the exchange part of each attempt (openai_stream.py: the session builds the request and turns
the reply into usage and cost itself). A session is pinned to one worker for its life (round
robin as sessions' clients are made), so its attempts keep one kept-alive connection. Workers
start by demand: a slot's process starts (in the background) when the first session pinned to
it makes its client, so one session costs one worker (~34 MB), not the whole pool.

A worker holds nothing acknowledged: it is killed with -9 and the attempts it was running fail
as ``connection`` failures, which ``ModelClient`` retries like any dropped connection (with its
usual backoff and a ``retry`` event); the next attempt starts a new worker in its place. litellm
stays in the daemon, for the providers that need it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import sys
from typing import Final

from orchestrator.models.call_frames import (
    decode_failure,
    decode_reply,
    encode_frame,
    read_frame,
)
from orchestrator.models.openai_stream import Exchange, RawReply, StreamRequest
from orchestrator.models.reply import AttemptFailed, DeltaKind, OnDelta
from orchestrator.procs import stop_process_group
from orchestrator.settings import PROCESS_STOP_GRACE_S

__all__ = [
    "WORKER_MODULE",
    "CallWorkers",
    "auto_worker_count",
    "install",
    "installed",
    "uninstall",
]

log = logging.getLogger(__name__)

WORKER_MODULE: Final = "orchestrator.models.call_worker"
# The daemon's own loop keeps one core busy with everything else a step needs.
CORES_KEPT_FOR_THE_DAEMON: Final = 1
# Below this many cores, workers only add process switches: the daemon parses in its loop.
MIN_CORES_FOR_WORKERS: Final = 4
# The most an unset ``model_workers`` gives: each worker is ~34 MB, and a stream's parsing is
# a small share of a step, so a few cores' worth carries many sessions.
AUTO_WORKERS_MAX: Final = 4


def auto_worker_count(cores: int | None = None) -> int:
    """``model_workers`` when the config leaves it unset: none on a small machine, else one
    per core the daemon's loop does not need, at most ``AUTO_WORKERS_MAX``."""
    cores = cores if cores is not None else (os.cpu_count() or 1)
    if cores < MIN_CORES_FOR_WORKERS:
        return 0
    return min(cores - CORES_KEPT_FOR_THE_DAEMON, AUTO_WORKERS_MAX)


class _Worker:
    """One worker process and the attempts it is running."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self._ids = itertools.count(1)
        self._waiting: dict[int, tuple[asyncio.Future[RawReply], OnDelta | None]] = {}
        self._reader = asyncio.create_task(self._read())

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None and not self._reader.done()

    async def exchange(self, request: StreamRequest, on_delta: OnDelta | None) -> RawReply:
        assert self.proc.stdin is not None
        rid = next(self._ids)
        future: asyncio.Future[RawReply] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = (future, on_delta)
        head = {
            "id": rid,
            "url": request.url,
            "headers": request.headers,
            "idle_s": request.idle_s,
            "deltas": on_delta is not None,
        }
        try:
            if self._reader.done():  # it died after the pool's look: nobody would answer
                raise self._died("")
            self.proc.stdin.write(encode_frame(head, request.body))
            await self.proc.stdin.drain()  # a worker that stops reading holds its senders back
            return await future
        except asyncio.CancelledError:
            with contextlib.suppress(ConnectionError, RuntimeError):
                self.proc.stdin.write(encode_frame({"id": rid, "cancel": True}))
            raise
        except (ConnectionError, RuntimeError) as exc:  # the pipe is gone: the worker died
            raise self._died(str(exc)) from None
        finally:
            self._waiting.pop(rid, None)

    def _died(self, detail: str) -> AttemptFailed:
        code = self.proc.returncode
        how = f"exit status {code}" if code is not None else detail or "its pipe closed"
        return AttemptFailed(
            "connection", f"the model-call worker (pid {self.proc.pid}) died ({how})"
        )

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            while True:
                head, _ = await read_frame(self.proc.stdout)
                waiting = self._waiting.get(int(head["id"]))
                if waiting is None:
                    continue  # an attempt given up on (cancelled) finished anyway
                future, on_delta = waiting
                if "delta" in head:
                    if on_delta is not None:
                        kind: DeltaKind = "thinking" if head.get("kind") == "thinking" else "text"
                        on_delta(str(head["delta"]), kind)
                elif future.done():
                    continue
                elif "reply" in head:
                    future.set_result(decode_reply(head["reply"]))
                else:
                    future.set_exception(decode_failure(head["failed"]))
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, KeyError) as exc:
            detail = "" if isinstance(exc, asyncio.IncompleteReadError) else str(exc)
        with contextlib.suppress(ProcessLookupError, TimeoutError):
            await asyncio.wait_for(self.proc.wait(), PROCESS_STOP_GRACE_S)
        failure = self._died(detail)
        for future, _ in self._waiting.values():
            if not future.done():
                future.set_exception(failure)

    async def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        await stop_process_group(self.proc, PROCESS_STOP_GRACE_S)
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


class CallWorkers:
    """``count`` worker slots; a slot starts its process when a client is first pinned to it,
    and again at the next attempt after a death."""

    def __init__(self, count: int) -> None:
        if count < 1:
            raise ValueError("a worker pool needs at least one worker")
        self.count = count
        self._slots: list[_Worker | None] = [None] * count
        self._starting: list[asyncio.Lock] = [asyncio.Lock() for _ in range(count)]
        self._next_slot = itertools.count()
        self.restarts = 0  # workers started again after one died
        self._warming: set[asyncio.Task[_Worker]] = set()

    def exchanger(self) -> Exchange:
        """An ``Exchange`` pinned to the next worker in turn (one per session's client); that
        worker starts now, in the background, so the session's first call finds it ready."""
        slot = next(self._next_slot) % self.count
        if self._slots[slot] is None:
            self._warm(slot)

        async def run(request: StreamRequest, on_delta: OnDelta | None) -> RawReply:
            worker = await self._worker(slot)
            return await worker.exchange(request, on_delta)

        return run

    def _warm(self, slot: int) -> None:
        try:
            task = asyncio.get_running_loop().create_task(self._worker(slot))
        except RuntimeError:
            return  # no loop here: the first attempt starts it
        self._warming.add(task)
        task.add_done_callback(self._warmed)

    def _warmed(self, task: asyncio.Task[_Worker]) -> None:
        self._warming.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # The attempt that needs this worker tries again and fails with the reason.
            log.warning("could not start a model-call worker: %s", task.exception())

    async def start(self) -> None:
        """Start every worker now (tests; a daemon starts them by demand)."""
        await asyncio.gather(*(self._worker(slot) for slot in range(self.count)))

    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._slots if w is not None and w.alive]

    async def _worker(self, slot: int) -> _Worker:
        async with self._starting[slot]:
            worker = self._slots[slot]
            if worker is not None and worker.alive:
                return worker
            if worker is not None:
                self.restarts += 1
                log.warning(
                    "model-call worker %d (pid %d) died; starting another", slot, worker.proc.pid
                )
                await worker.stop()
            try:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    WORKER_MODULE,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    start_new_session=True,
                )
            except OSError as exc:
                raise AttemptFailed(
                    "connection", f"cannot start a model-call worker: {exc}"
                ) from exc
            worker = _Worker(proc)
            self._slots[slot] = worker
            return worker

    async def close(self) -> None:
        for task in self._warming:
            task.cancel()
        await asyncio.gather(*self._warming, return_exceptions=True)
        workers = [w for w in self._slots if w is not None]
        self._slots = [None] * self.count
        await asyncio.gather(*(w.stop() for w in workers), return_exceptions=True)


_installed: CallWorkers | None = None


def install(count: int) -> CallWorkers | None:
    """Make this process's OpenAI-compatible clients use ``count`` workers (none for 0)."""
    global _installed
    _installed = CallWorkers(count) if count > 0 else None
    return _installed


def installed() -> CallWorkers | None:
    return _installed


async def uninstall() -> None:
    global _installed
    pool, _installed = _installed, None
    if pool is not None:
        await pool.close()
