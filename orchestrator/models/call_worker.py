"""A model-call worker process: ``python -m orchestrator.models.call_worker``.

It runs OpenAI-compatible exchanges (``openai_stream.exchange``: the HTTP request and the SSE
stream) for a daemon, so their parsing runs on this process's CPU and loop rather than on the
daemon's, which every session shares. Requests come as frames on stdin, answers go as frames
on stdout (call_frames.py); many run at once. It holds nothing that must survive it: a
worker killed mid-stream costs that attempt, which the daemon retries (call_workers.py). It
exits when stdin closes, and with its parent (``PR_SET_PDEATHSIG``). It imports neither
litellm nor duckdb: ~34 MB.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import sys
from typing import Any

from orchestrator.models.call_frames import encode_failure, encode_frame, encode_reply, read_frame
from orchestrator.models.openai_stream import StreamRequest, close_pools, exchange
from orchestrator.models.reply import AttemptFailed, DeltaKind
from orchestrator.procs import set_parent_death_signal

__all__ = ["main"]


class _Worker:
    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._tasks: dict[int, asyncio.Task[None]] = {}

    def take(self, head: dict[str, Any], body: bytes) -> None:
        rid = int(head["id"])
        if head.get("cancel"):
            task = self._tasks.get(rid)
            if task is not None:
                task.cancel()
            return
        request = StreamRequest(
            str(head["url"]), dict(head["headers"]), body, float(head["idle_s"])
        )
        task = asyncio.create_task(self._run(rid, request, bool(head.get("deltas"))))
        self._tasks[rid] = task
        task.add_done_callback(lambda _done: self._tasks.pop(rid, None))

    async def _run(self, rid: int, request: StreamRequest, deltas: bool) -> None:
        waiting: list[tuple[DeltaKind, str]] = []

        def flush() -> None:
            # Consecutive pieces of one kind travel as one frame, in order.
            for kind, group in itertools.groupby(waiting, key=lambda piece: piece[0]):
                self._send({"id": rid, "delta": "".join(t for _, t in group), "kind": kind})
            waiting.clear()

        def on_delta(text: str, kind: DeltaKind) -> None:
            # One flush per loop iteration (a network piece), not one frame per SSE event.
            if not waiting:
                asyncio.get_running_loop().call_soon(flush)
            waiting.append((kind, text))

        try:
            reply = await exchange(request, on_delta if deltas else None)
        except AttemptFailed as exc:
            flush()
            self._send({"id": rid, "failed": encode_failure(exc)})
        except asyncio.CancelledError:
            return  # the daemon gave the call up: it waits for nothing
        except Exception as exc:  # a bug here must fail one attempt, not the worker
            flush()
            failed = AttemptFailed(
                "bad_response", f"model-call worker: {type(exc).__name__}: {exc}"
            )
            self._send({"id": rid, "failed": encode_failure(failed)})
        else:
            flush()
            self._send({"id": rid, "reply": encode_reply(reply)})

    def _send(self, head: dict[str, Any]) -> None:
        self._writer.write(encode_frame(head))

    async def close(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        await close_pools()


async def _serve() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
    transport, protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, sys.stdout.buffer
    )
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    worker = _Worker(writer)
    try:
        while True:
            try:
                head, body = await read_frame(reader)
            except asyncio.IncompleteReadError:
                return  # the daemon closed our stdin: it is done with us
            worker.take(head, body)
    finally:
        await worker.close()
        with contextlib.suppress(ConnectionError):
            await writer.drain()


def main() -> None:
    set_parent_death_signal(signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the daemon stops us by closing stdin or TERM
    asyncio.run(_serve())


if __name__ == "__main__":
    main()
