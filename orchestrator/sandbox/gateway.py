"""Async client of one Jupyter Kernel Gateway and its one kernel.

REST (httpx) for the kernel's lifecycle: create, interrupt, restart, delete. One WebSocket
(``websockets``) on ``/api/kernels/{id}/channels`` for the Jupyter messages, which we build
ourselves (legacy JSON framing, no subprotocol). A reader task owns the socket and routes each
message to the request it answers (by ``parent_header.msg_id``); output of the running cell goes
straight into its ``OutputCollector``, so nothing queues up in memory.

Lifecycle facts this relies on (`docs/sandbox.md`, "How a sandbox starts"):

- ``POST /api/kernels`` and ``/restart`` return before the kernel answers; we always wait for a
  ``kernel_info_reply`` AND its iopub ``idle``: after a restart the gateway's iopub subscription
  reconnects later than shell (ZMQ slow joiner), and a cell sent in between loses its output.
  The probe is re-sent every ``KERNEL_INFO_RESEND_S`` until one gets both.
- The gateway's restarter revives a dead kernel by itself and announces it with an iopub status
  ``restarting`` (``dead`` when it gives up); that is how a kernel killed mid-cell is noticed.
- A cell is finished when both its ``execute_reply`` (shell) and its ``idle`` status (iopub)
  have arrived: the two channels are not ordered with respect to each other.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Literal

import httpx
import websockets
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from orchestrator.errors import KernelDied, SandboxError
from orchestrator.runtime.spill import SPILL_CONTENT_KEY, SPILL_METADATA_KEY
from orchestrator.sandbox.base import CellResult
from orchestrator.sandbox.output import OutputCollector

__all__ = [
    "JUPYTER_PROTOCOL_VERSION",
    "KernelGatewayClient",
    "build_message",
]

log = logging.getLogger(__name__)

JUPYTER_PROTOCOL_VERSION = "5.4"
USERNAME = "prime-agent"
HTTP_TIMEOUT_S = 30.0
# One message bigger than this (a single ``print`` of 16 MiB) closes the socket (code 1009); we
# reconnect and tell the model that a piece of output was dropped. The bound keeps the host's
# memory independent of what a cell prints (R10): decoding one frame costs ~4x its size at peak.
WS_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
WS_CLOSE_TOO_BIG = 1009
WS_RECONNECT_ATTEMPTS = 3
# After we fail the socket (oversized frame) the closing handshake may sit behind megabytes
# the gateway is still sending; do not wait the default 10 s for it.
WS_CLOSE_TIMEOUT_S = 1.0
KERNEL_INFO_RESEND_S = 0.2
IS_ALIVE_TIMEOUT_S = 2.0  # a liveness probe that takes longer is a no
# After an execute_reply, how long the matching iopub idle may lag before we stop waiting: on a
# socket that was reopened during the cell (the idle may have been lost with the old one), and
# on the same socket (the cell's last output may still be on its way: a gateway serializing a
# big message is silent for seconds, and a cell that ends before it arrives would leave it,
# and its "dropped" note, to the next cell).
IDLE_AFTER_REPLY_S = 1.0
IDLE_AFTER_REPLY_CONNECTED_S = 30.0
# A request's time limit is one timer, armed again only when the limit comes earlier by more
# than this (after the reply it is recomputed from two clocks at every message, with jitter).
WAIT_TIMER_SLACK_S = 0.01
KERNEL_READY_TIMEOUT_S = 60.0
# The gateway answers the channels handshake only once its kernel has started and answered
# kernel_info (jupyter_server's ``prepare``), so opening the first socket includes the kernel's
# start: a 10 s bound failed local sandboxes on a loaded CI machine ("timed out during opening
# handshake"). It is the kernel's readiness bound.
WS_OPEN_TIMEOUT_S = KERNEL_READY_TIMEOUT_S
# After a timed-out cell was interrupted, the kernel kills the copies of itself the cell forked
# (they ignore or outlive the interrupt). The window reaches this far before the cell's start
# (clock-tick rounding; the host's and the kernel's clocks are read at different moments).
FORKED_COPIES_MARGIN_S = 1.0
_KILL_COPIES_EXPR = (
    "__import__('orchestrator.sandbox.proctree', fromlist=['_']).kill_forked_copies({window:.3f})"
)

_Outcome = Literal["done", "gone", "timeout"]


def build_message(
    msg_type: str, content: Mapping[str, Any], *, session: str, channel: str = "shell"
) -> dict[str, Any]:
    """A Jupyter protocol message as the gateway's JSON websocket framing expects it."""
    return {
        "header": {
            "msg_id": uuid.uuid4().hex,
            "session": session,
            "username": USERNAME,
            "date": datetime.now(UTC).isoformat(),
            "msg_type": msg_type,
            "version": JUPYTER_PROTOCOL_VERSION,
        },
        "parent_header": {},
        "metadata": {},
        "content": dict(content),
        "channel": channel,
        "buffers": [],
    }


class _Pending:
    """One request in flight; the reader task feeds it, the requester waits on ``wake``."""

    def __init__(
        self,
        msg_id: str,
        reply_type: str,
        collector: OutputCollector | None,
        *,
        need_idle: bool = False,
    ):
        self.msg_id = msg_id
        self.reply_type = reply_type
        self.collector = collector
        # wait for the iopub idle too: always for cells (their output travels on iopub), and
        # for the readiness probe (proof that iopub is connected, not only shell).
        self.need_idle = need_idle or collector is not None
        self.reply: dict[str, Any] | None = None
        self.reply_at = 0.0
        self.idle = False
        self.error_seen = False
        self.noted = False  # the "message dropped" note was added
        self.reconnected = False  # the socket was reopened while this request was in flight
        self.gone: str | None = None  # "restarting" / "dead": the kernel went away
        self.wake = asyncio.Event()

    @property
    def done(self) -> bool:
        return self.reply is not None and (self.idle or not self.need_idle)

    def handle(self, msg: dict[str, Any]) -> None:
        msg_type = msg.get("msg_type") or msg.get("header", {}).get("msg_type", "")
        content = msg.get("content") or {}
        collector = self.collector
        if msg_type == self.reply_type:
            self.reply = content
            self.reply_at = time.monotonic()
        elif msg_type == "status":
            if content.get("execution_state") == "idle":
                self.idle = True
        elif collector is None:
            return
        elif msg_type == "stream":
            name = content.get("name")
            if name in ("stdout", "stderr"):
                spill = content.get(SPILL_CONTENT_KEY)
                if isinstance(spill, dict):  # the kernel wrote the rest to a file
                    collector.spilled(name, spill)
                collector.add(name, str(content.get("text", "")))
        elif msg_type == "execute_result":
            collector.add_block("result", _plain_text(content), content.get(SPILL_CONTENT_KEY))
        elif msg_type in ("display_data", "update_display_data"):
            collector.add_block("display", _plain_text(content), content.get(SPILL_CONTENT_KEY))
        elif msg_type == "error":
            self.error_seen = True
            collector.set_error(
                str(content.get("ename", "")),
                str(content.get("evalue", "")),
                [str(line) for line in content.get("traceback", [])],
            )
        else:
            return  # execute_input, clear_output, comm_*: nothing the model reads
        self.wake.set()


def _plain_text(content: Mapping[str, Any]) -> str:
    data = content.get("data") or {}
    text = data.get("text/plain")
    if isinstance(text, list):  # nbformat allows a list of lines
        text = "".join(str(part) for part in text)
    if isinstance(text, str):
        return text
    kinds = ", ".join(sorted(str(k) for k in data)) or "empty"
    return f"[display output of type {kinds}; no text form]"


class KernelGatewayClient:
    """REST + WebSocket client for one kernel on one gateway.

    ``on_restart`` is awaited after every kernel restart (ours or the gateway's) once the new
    kernel answers, before the caller sees a result: the sandbox re-applies the session's cwd
    and environment there.
    """

    def __init__(self, base_url: str, token: str, *, uds: str | None = None):
        # ``uds``: reach the gateway through this Unix socket (docker backend: the container has
        # no network); ``base_url`` then only names the Host header and paths.
        self.base_url = base_url.rstrip("/")
        self.uds = uds
        self.kernel_id = ""
        self.session = uuid.uuid4().hex
        self.on_restart: Callable[[], Awaitable[None]] | None = None
        # Restarts the gateway did on its own (the kernel died) that no result has reported yet.
        self.unreported_restarts = 0
        self._token = token
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers={"Authorization": f"token {token}"},
            timeout=HTTP_TIMEOUT_S,
            trust_env=False,  # loopback: never through a proxy from the environment
            # Plain HTTP (loopback or a Unix socket): no TLS, so no CA bundle to load, which
            # costs ~20 ms of the event loop per client.
            verify=False,
            transport=httpx.AsyncHTTPTransport(uds=uds, verify=False) if uds else None,
        )
        self._ws: ClientConnection | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: _Pending | None = None
        # A cell whose caller cancelled it: interrupted, but its reply is still to come. The
        # next request waits for it first (a request sent while the kernel unwinds the
        # KeyboardInterrupt would be aborted by stop_on_error).
        self._abandoned: _Pending | None = None
        self._abandoned_grace_s = 0.0
        self._disconnected = asyncio.Event()
        self._close_code: int | None = None
        # The requests in flight when the socket failed on an oversized message: only they
        # are told that output was dropped (it cannot be older than the request in flight).
        self._dropped_for: set[str] = set()
        self._own_restart = False
        self._closed = False

    # --- REST -----------------------------------------------------------------------------

    async def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise SandboxError(f"kernel gateway {method} {path} failed: {exc!r}") from exc
        if response.status_code >= 400:
            raise SandboxError(
                f"kernel gateway {method} {path}: HTTP {response.status_code} {response.text[:200]}"
            )
        return response

    async def start_kernel(self, *, env: Mapping[str, str], path: str) -> str:
        """POST /api/kernels with an explicit env (without one the kernel would inherit the
        gateway's whole environment)."""
        response = await self._call("POST", "/api/kernels", json={"env": dict(env), "path": path})
        self.kernel_id = str(response.json()["id"])
        return self.kernel_id

    async def kernel_model(self) -> dict[str, Any]:
        response = await self._call("GET", f"/api/kernels/{self.kernel_id}")
        model: dict[str, Any] = response.json()
        return model

    async def kernel_alive(self, timeout_s: float = IS_ALIVE_TIMEOUT_S) -> bool:
        """The gateway answers and does not report the kernel dead (never raises)."""
        try:
            async with asyncio.timeout(timeout_s):
                model = await self.kernel_model()
        except (SandboxError, TimeoutError):
            return False
        return model.get("execution_state") != "dead"

    async def interrupt(self) -> None:
        await self._call("POST", f"/api/kernels/{self.kernel_id}/interrupt")

    async def restart(self, *, timeout_s: float = KERNEL_READY_TIMEOUT_S) -> None:
        """Restart the kernel (namespace lost); return once the new one answers kernel_info."""
        self._own_restart = True
        self._abandoned = None  # whatever it was running is gone with it
        try:
            await self._call("POST", f"/api/kernels/{self.kernel_id}/restart")
            await self.wait_ready(timeout_s=timeout_s)
        finally:
            self._own_restart = False
        if self.on_restart is not None:
            await self.on_restart()

    async def _interrupt_quietly(self) -> None:
        with contextlib.suppress(SandboxError):
            await self.interrupt()

    async def delete_kernel(self) -> None:
        await self._call("DELETE", f"/api/kernels/{self.kernel_id}")

    # --- WebSocket ------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """The channels socket is open (False once the gateway's end went away)."""
        return self._ws is not None and not self._disconnected.is_set()

    async def connect(self) -> None:
        """Open the channels socket (again); output produced meanwhile is replayed by the
        gateway because we reuse our session id."""
        url = self.base_url.replace("http://", "ws://", 1)
        url = f"{url}/api/kernels/{self.kernel_id}/channels?session_id={self.session}"
        options: dict[str, Any] = {
            "additional_headers": {"Authorization": f"token {self._token}"},
            "max_size": WS_MAX_MESSAGE_BYTES,
            "compression": None,  # loopback: deflate would only cost CPU on big outputs
            "open_timeout": WS_OPEN_TIMEOUT_S,
            "close_timeout": WS_CLOSE_TIMEOUT_S,
        }
        try:
            if self.uds:
                ws = await websockets.unix_connect(self.uds, url, **options)
            else:
                ws = await websockets.connect(url, proxy=None, **options)
        except (OSError, InvalidHandshake, TimeoutError) as exc:
            if isinstance(exc, InvalidStatus):
                detail = f"HTTP {exc.response.status_code}"
            else:
                detail = repr(exc)
            raise SandboxError(f"kernel gateway websocket failed: {detail}") from exc
        self._ws = ws
        self._disconnected.clear()
        self._close_code = None
        self._dropped_for = set()
        self._reader = asyncio.get_running_loop().create_task(
            self._read_loop(ws), name=f"kernel-ws-{self.kernel_id[:8]}"
        )

    async def _read_loop(self, ws: ClientConnection) -> None:
        try:
            async for raw in ws:
                if isinstance(raw, bytes):
                    continue  # binary framing: only messages with buffers (widgets)
                try:
                    msg = json.loads(raw)
                except ValueError:
                    log.warning("kernel gateway sent a frame that is not JSON")
                    continue
                self._dispatch(msg)
        except ConnectionClosed as exc:
            # Our side closes with 1009 when a frame exceeds max_size: look at both frames.
            codes = [frame.code for frame in (exc.sent, exc.rcvd) if frame is not None]
            self._close_code = WS_CLOSE_TOO_BIG if WS_CLOSE_TOO_BIG in codes else ws.close_code
            if self._close_code == WS_CLOSE_TOO_BIG:
                self._dropped_for = {
                    waiter.msg_id
                    for waiter in (self._pending, self._abandoned)
                    if waiter is not None
                }
        finally:
            self._disconnected.set()
            for waiter in (self._pending, self._abandoned):
                if waiter is not None:
                    waiter.wake.set()

    def _dispatch(self, msg: dict[str, Any]) -> None:
        pending = self._pending
        parent = (msg.get("parent_header") or {}).get("msg_id")
        if msg.get("msg_type") == "status" and not parent:
            state = (msg.get("content") or {}).get("execution_state")
            if state in ("restarting", "dead") and not self._own_restart:
                # The gateway noticed the kernel process died (and restarts it).
                log.warning("kernel %s: %s", self.kernel_id, state)
                target = pending if pending is not None else self._abandoned
                if target is not None and target.gone is None:
                    target.gone = str(state)
                    target.wake.set()
                else:
                    self.unreported_restarts += 1
            return
        if pending is not None and parent == pending.msg_id:
            pending.handle(msg)
        elif self._abandoned is not None and parent == self._abandoned.msg_id:
            self._abandoned.handle(msg)

    async def _send(self, msg: dict[str, Any]) -> None:
        if self._ws is None or self._disconnected.is_set():
            await self._reconnect()
        assert self._ws is not None
        data = json.dumps(msg)
        try:
            await self._ws.send(data)
        except ConnectionClosed:
            await self._reconnect()
            try:
                await self._ws.send(data)
            except ConnectionClosed as exc:
                raise SandboxError(f"kernel gateway websocket closed: {exc}") from exc

    async def _reconnect(self) -> None:
        if self._closed:
            raise SandboxError("kernel gateway client is closed")
        await self._drop_socket()
        last: SandboxError | None = None
        for attempt in range(WS_RECONNECT_ATTEMPTS):
            try:
                await self.connect()
                return
            except SandboxError as exc:
                last = exc
                await asyncio.sleep(0.1 * (attempt + 1))
        raise SandboxError(f"kernel gateway unreachable: {last}")

    async def _drop_socket(self) -> None:
        ws, reader = self._ws, self._reader
        self._ws = None
        self._reader = None
        if ws is not None:
            with contextlib.suppress(Exception):
                await ws.close()
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader

    # --- requests -------------------------------------------------------------------------

    async def _wait(self, pending: _Pending, deadline: float) -> _Outcome:
        """Until ``pending`` is done, its kernel is gone or its time is up. Each of a cell's
        messages wakes this, and so does one timer at the time limit, armed again only when
        the limit comes earlier or has passed: an ``asyncio.timeout`` per message cost the
        shared event loop a timer per message (docs/benchmarks.md, "Where a step's host CPU
        goes"). A timer that fires early (the limit moved later) only makes this look again."""
        loop = asyncio.get_running_loop()
        timer: asyncio.TimerHandle | None = None
        try:
            while True:
                if pending.gone is not None:
                    return "gone"
                if pending.done:
                    return "done"
                if self._disconnected.is_set():
                    self._note_dropped_message(pending)
                    pending.reconnected = True
                    await self._reconnect()
                    continue
                until = deadline
                if pending.reply is not None and pending.collector is not None:
                    # Reply is in; give the idle status a while, not the whole cell timeout.
                    grace = (
                        IDLE_AFTER_REPLY_S if pending.reconnected else IDLE_AFTER_REPLY_CONNECTED_S
                    )
                    until = min(deadline, loop.time() + grace - _since(pending.reply_at))
                remaining = until - loop.time()
                if remaining <= 0:
                    if pending.reply is None or pending.collector is None:
                        return "timeout"  # (a readiness probe without its idle is not ready)
                    # The idle never came. One reason: a frame over max_size made our side fail
                    # the socket while the gateway was still pushing that frame; the rest of this
                    # cell's output was lost with it.
                    self._note_dropped_message(pending)
                    return "done"
                if (
                    timer is None
                    or loop.time() >= timer.when()
                    or until < timer.when() - WAIT_TIMER_SLACK_S
                ):
                    if timer is not None:
                        timer.cancel()
                    timer = loop.call_at(until, pending.wake.set)  # the limit wakes it too
                pending.wake.clear()
                await pending.wake.wait()
        finally:
            if timer is not None:
                timer.cancel()

    def _note_dropped_message(self, pending: _Pending) -> None:
        code = self._close_code if pending.msg_id in self._dropped_for else None
        ws = self._ws
        if ws is not None and ws.protocol.close_sent is not None:
            # Our side is failing the socket right now, while this request is in flight.
            code = ws.protocol.close_sent.code
        if code == WS_CLOSE_TOO_BIG and pending.collector is not None and not pending.noted:
            pending.noted = True
            limit_mib = WS_MAX_MESSAGE_BYTES // (1024 * 1024)
            pending.collector.note(f"[an output message over {limit_mib} MiB was dropped]")

    async def wait_ready(self, *, timeout_s: float = KERNEL_READY_TIMEOUT_S) -> dict[str, Any]:
        """Send kernel_info_request until one is answered; return the reply content."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            msg = build_message("kernel_info_request", {}, session=self.session)
            pending = _Pending(msg["header"]["msg_id"], "kernel_info_reply", None, need_idle=True)
            self._pending = pending
            try:
                await self._send(msg)
                step = min(deadline, loop.time() + KERNEL_INFO_RESEND_S)
                outcome = await self._wait(pending, step)
                if outcome == "done":
                    assert pending.reply is not None
                    return pending.reply
            finally:
                self._pending = None
            if loop.time() >= deadline:
                raise KernelDied(f"kernel did not answer kernel_info within {timeout_s:.0f} s")

    async def run_silent(
        self,
        code: str,
        *,
        user_expressions: Mapping[str, str] | None = None,
        timeout_s: float = KERNEL_READY_TIMEOUT_S,
    ) -> dict[str, Any]:
        """Execute host code (no history, no output); raise if it fails. Returns the reply."""
        content = {
            "code": code,
            "silent": True,
            "store_history": False,
            "user_expressions": dict(user_expressions or {}),
            "allow_stdin": False,
            "stop_on_error": False,
        }
        msg = build_message("execute_request", content, session=self.session)
        pending = _Pending(msg["header"]["msg_id"], "execute_reply", None)
        self._pending = pending
        try:
            await self._send(msg)
            outcome = await self._wait(pending, asyncio.get_running_loop().time() + timeout_s)
        finally:
            self._pending = None
        if outcome == "gone":
            # The gateway restarted the kernel under this request: the next cell's ``prepare``
            # must set the new one up (cwd, env, namespace) and say so.
            self.unreported_restarts += 1
        if outcome != "done" or pending.reply is None:
            raise KernelDied(f"kernel setup did not complete ({outcome})")
        reply = pending.reply
        if reply.get("status") != "ok":
            raise SandboxError(
                f"kernel setup failed: {reply.get('ename')}: {str(reply.get('evalue'))[:500]}"
            )
        return reply

    async def execute(
        self,
        code: str,
        *,
        timeout_s: float,
        interrupt_grace_s: float,
        collector: OutputCollector,
    ) -> CellResult:
        """Run one cell; see ``Sandbox.execute`` for the timeout and kernel-death rules."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        content = {
            "code": code,
            "silent": False,
            "store_history": True,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
        }
        msg = build_message("execute_request", content, session=self.session)
        # Huge output stays in the sandbox: the kernel writes it to a file (runtime/spill.py).
        msg["metadata"][SPILL_METADATA_KEY] = collector.spill_request()
        pending = _Pending(msg["header"]["msg_id"], "execute_reply", collector)
        self._pending = pending

        def elapsed_ms() -> float:
            return (loop.time() - started) * 1000.0

        try:
            await self._send(msg)
            outcome = await self._wait(pending, started + timeout_s)
        except asyncio.CancelledError:
            # Our caller gave up on the cell; do not leave it running in the kernel, or the
            # next cell would queue behind it. ``prepare`` settles it before the next request.
            self._pending = None
            pending.collector = None
            self._abandoned = pending
            self._abandoned_grace_s = interrupt_grace_s
            await asyncio.shield(self._interrupt_quietly())
            raise
        try:
            if outcome == "done":
                return self._finish(pending, elapsed_ms())
            if outcome == "gone":
                return await self._after_death(pending, elapsed_ms)
            # Timed out: interrupt, give the cell the grace period to stop.
            with contextlib.suppress(SandboxError):
                await self.interrupt()
            outcome = await self._wait(pending, loop.time() + interrupt_grace_s)
            if outcome == "gone":
                return await self._after_death(pending, elapsed_ms)
            if outcome == "done":
                notice = f"cell timed out after {timeout_s:g} s and was interrupted; "
                self._pending = None
                copies = await self._kill_forked_copies(elapsed_ms(), interrupt_grace_s)
                if copies is not None:
                    if copies:
                        notice += f"{copies} forked copies of the kernel it left were killed; "
                    return self._finish(
                        pending,
                        elapsed_ms(),
                        status="timeout",
                        notice=notice + "the namespace is kept.",
                    )
                reason = "its forked processes could not be cleaned up"
            else:
                reason = f"it did not stop within {interrupt_grace_s:g} s of an interrupt"
        finally:
            self._pending = None
        # It ignored the interrupt, or left processes we cannot reach from the kernel: restart
        # (the gateway kills everything the old kernel left; the namespace is lost).
        await self.restart()
        return collector.result(
            "timeout",
            duration_ms=elapsed_ms(),
            kernel_restarted=True,
            notice=f"cell timed out after {timeout_s:g} s and {reason}; the kernel was "
            "restarted and the namespace is lost.",
        )

    async def _kill_forked_copies(self, elapsed_ms: float, timeout_s: float) -> int | None:
        """Have the kernel kill the copies of itself forked during the cell that just ended;
        how many (None when the kernel could not do it in time)."""
        window = elapsed_ms / 1000.0 + FORKED_COPIES_MARGIN_S
        try:
            reply = await self.run_silent(
                "",
                user_expressions={"copies": _KILL_COPIES_EXPR.format(window=window)},
                timeout_s=timeout_s,
            )
            value = reply["user_expressions"]["copies"]
            if value.get("status") != "ok":
                log.warning("kernel %s: killing forked copies failed: %s", self.kernel_id, value)
                return None
            return int(value["data"]["text/plain"])
        except (SandboxError, KeyError, TypeError, ValueError) as exc:
            log.warning("kernel %s: killing forked copies failed: %s", self.kernel_id, exc)
            return None

    def _finish(
        self, pending: _Pending, duration_ms: float, *, status: str = "", notice: str = ""
    ) -> CellResult:
        assert pending.collector is not None and pending.reply is not None
        reply = pending.reply
        reply_status = str(reply.get("status", "error"))
        if reply_status == "error" and not pending.error_seen:
            # The iopub error message got lost or came late; the reply carries the same fields.
            pending.collector.set_error(
                str(reply.get("ename", "")),
                str(reply.get("evalue", "")),
                [str(line) for line in reply.get("traceback", [])],
            )
        if not status:
            status = {"ok": "ok", "error": "error", "aborted": "aborted"}.get(reply_status, "error")
        return pending.collector.result(
            status,  # type: ignore[arg-type]
            duration_ms=duration_ms,
            notice=notice,
        )

    async def _after_death(self, pending: _Pending, elapsed_ms: Callable[[], float]) -> CellResult:
        assert pending.collector is not None
        self._pending = None
        if pending.gone == "dead":
            # The gateway gave up restarting it; try once ourselves.
            try:
                await self.restart()
            except SandboxError as exc:
                raise KernelDied(f"the kernel died and could not be restarted: {exc}") from exc
        else:
            await self.wait_ready()
            if self.on_restart is not None:
                await self.on_restart()
        return pending.collector.result(
            "kernel_died",
            duration_ms=elapsed_ms(),
            kernel_restarted=True,
            notice="the kernel died during this cell (killed or crashed); it was restarted and "
            "the namespace is lost.",
        )

    async def prepare(self) -> str:
        """Before a cell: settle a cancelled cell and any restart since the last cell.

        Returns a notice for the model ("" when nothing happened to the namespace).
        """
        notices: list[str] = []
        abandoned = self._abandoned
        if abandoned is not None:
            deadline = asyncio.get_running_loop().time() + self._abandoned_grace_s
            outcome = await self._wait(abandoned, deadline)
            self._abandoned = None
            if outcome == "gone":
                await self._recover_after_gateway_restart()
                notices.append(
                    "the kernel died while the previous (cancelled) cell stopped; it was "
                    "restarted and the namespace is lost."
                )
            elif outcome == "timeout" and abandoned.reply is None:
                await self.restart()
                notices.append(
                    "the previous (cancelled) cell did not stop after an interrupt; the kernel "
                    "was restarted and the namespace is lost."
                )
        if self.unreported_restarts:
            await self._recover_after_gateway_restart()
            notices.append(
                "the kernel died after the previous cell and was restarted; the namespace is lost."
            )
        return " ".join(notices)

    async def _recover_after_gateway_restart(self) -> None:
        self.unreported_restarts = 0
        await self.wait_ready()
        if self.on_restart is not None:
            await self.on_restart()

    async def close(self) -> None:
        self._closed = True
        await self._drop_socket()
        await self._http.aclose()


def _since(t: float) -> float:
    return time.monotonic() - t
