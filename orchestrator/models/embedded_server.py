"""Child process that serves the embedded GGUF model over llama.cpp's OpenAI-compatible HTTP API.

Run as ``python -m orchestrator.models.embedded_server --model PATH --threads N --ctx N``. It
starts ``xllamacpp.Server`` on 127.0.0.1 with a random port, waits until ``/v1/models``
answers, prints exactly one JSON line ``{"port": N, "api_base": "...", "model": "..."}`` on
stdout (the ready line ``orchestrator.procs.start_child`` waits for) and serves until SIGTERM or
SIGINT, or until its parent process goes away.

Why a child process and not ``xllamacpp.Server`` inside the orchestrator: llama.cpp installs its
own SIGINT/SIGTERM handlers, holds ~0.7 GB, and a native crash there must not take the daemon
with it. A process group can also be stopped as a whole (SIGTERM -> grace -> SIGKILL).

This module imports only the standard library at import time (``xllamacpp`` is imported in
``main``) so that the parent can import its constants cheaply.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from types import FrameType
from typing import Any, TextIO

__all__ = [
    "API_KEY_ENV",
    "EXIT_BAD_USAGE",
    "EXIT_LOAD_FAILED",
    "EXIT_PARENT_GONE",
    "EXIT_RUNTIME_MISSING",
    "LISTEN_HOST",
    "build_params",
    "main",
]

# The parent passes the per-start API key in the environment, never in argv (argv is visible to
# every user through ps; /proc/PID/environ is readable only by the owner).
API_KEY_ENV = "PRIME_AGENT_EMBEDDED_API_KEY"
LISTEN_HOST = "127.0.0.1"
RANDOM_PORT = 0  # llama.cpp binds an ephemeral port and reports it in listening_address

# llama.cpp log threshold: 1 = errors, 2 = + warnings, 3 = + info (one block per request).
# Warnings and errors are what the parent shows when start fails; info would grow the log file
# by several lines per request.
LOG_VERBOSITY = 2
# One slot: on a 2-core machine parallel decoding only splits the same cores, and every slot
# would get a fraction of the context. Requests queue inside llama.cpp instead.
PARALLEL_SLOTS = 1
# Host-memory prompt cache llama.cpp keeps for slots it switches away from (several sessions
# sharing one slot). The library default is 8 GiB; a full 8k context of the 1.5B model is
# ~0.25 GB, so 1 GiB keeps several conversations without letting the cache grow unbounded.
PROMPT_CACHE_RAM_MIB = 1024

READY_PROBE_TIMEOUT_S = 30.0  # the model is loaded when Server() returns; HTTP should follow
READY_PROBE_INTERVAL_S = 0.05
READY_PROBE_REQUEST_TIMEOUT_S = 2.0
PARENT_POLL_INTERVAL_S = 0.5  # how often to notice a dead parent / a pending signal
SHUTDOWN_TIMEOUT_S = 3.0  # after this, skip llama.cpp's orderly teardown and exit at once

EXIT_OK = 0
EXIT_LOAD_FAILED = 1
EXIT_BAD_USAGE = 2
EXIT_RUNTIME_MISSING = 3
EXIT_PARENT_GONE = 4


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator.models.embedded_server",
        description="Serve a GGUF model with llama.cpp (xllamacpp) on a random loopback port.",
    )
    parser.add_argument("--model", required=True, help="path of the .gguf file")
    parser.add_argument("--threads", type=int, required=True, help="CPU threads for decoding")
    parser.add_argument("--ctx", type=int, required=True, help="context size in tokens")
    parser.add_argument("--alias", default="", help="model id reported by /v1/models")
    parser.add_argument(
        "--parent-pid",
        type=int,
        default=0,
        help="exit when this process is no longer our parent (0: do not watch)",
    )
    args = parser.parse_args(argv)
    if args.threads < 1 or args.ctx < 1:
        parser.error("--threads and --ctx must be positive")
    return args


def build_params(
    xllamacpp: Any, *, model: str, threads: int, ctx: int, alias: str, api_key: str
) -> Any:
    """Fill an ``xllamacpp.CommonParams`` (the fields of llama.cpp's ``common_params``)."""
    params = xllamacpp.CommonParams()
    params.model.path = model
    params.n_ctx = ctx
    # Both prompt processing (batch) and generation must honour the configured count: llama.cpp's
    # defaults use every core, and busy-waiting OpenMP threads starve the REPL on 2 cores.
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    params.hostnames = [LISTEN_HOST]
    params.port = RANDOM_PORT
    if api_key:
        params.api_keys = [api_key]
    if alias:
        params.model_alias = {alias}
    params.n_parallel = PARALLEL_SLOTS
    params.cache_ram_mib = PROMPT_CACHE_RAM_MIB
    params.verbosity = LOG_VERBOSITY
    # Nothing but the OpenAI-compatible API: no web UI, no slot inspection endpoint.
    params.ui = False
    params.endpoint_slots = False
    return params


def _port_of(address: str) -> int:
    """``listening_address`` is ``http://127.0.0.1:PORT``."""
    port = urllib.parse.urlsplit(address).port
    if port is None:
        raise ValueError(f"no port in listening address {address!r}")
    return port


def _wait_until_answers(api_base: str, api_key: str) -> None:
    request = urllib.request.Request(f"{api_base}/models")
    if api_key:
        request.add_header("Authorization", f"Bearer {api_key}")
    deadline = time.monotonic() + READY_PROBE_TIMEOUT_S
    last_error = ""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(request, timeout=READY_PROBE_REQUEST_TIMEOUT_S) as reply:
                if reply.status == 200:
                    return
                last_error = f"HTTP {reply.status}"
        except (urllib.error.URLError, OSError) as exc:
            last_error = str(exc)
        time.sleep(READY_PROBE_INTERVAL_S)
    raise TimeoutError(f"{api_base}/models did not answer: {last_error}")


def _parent_gone(parent_pid: int) -> bool:
    # When the parent dies we are re-parented (to init or a subreaper), so getppid() changes.
    # PR_SET_PDEATHSIG normally delivers SIGTERM first; this covers the window before prctl ran
    # and platforms without it.
    return parent_pid > 0 and os.getppid() != parent_pid


def _exit_soon_watchdog() -> None:
    # If llama.cpp's teardown hangs (a request stuck in a socket write), leave anyway; the parent
    # would otherwise wait its grace period and SIGKILL the group.
    timer = threading.Timer(SHUTDOWN_TIMEOUT_S, os._exit, args=(EXIT_OK,))
    timer.daemon = True
    timer.start()


def _ready_stream() -> TextIO:
    """Keep the real stdout for the ready line; send every other write on fd 1 to stderr.

    llama.cpp and libraries may print to stdout; anything before or instead of our JSON line would
    be read by the parent as the ready line.
    """
    ready_fd = os.dup(sys.stdout.fileno())
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    return os.fdopen(ready_fd, "w", encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    ready_out = _ready_stream()
    if _parent_gone(args.parent_pid):
        return EXIT_PARENT_GONE
    try:
        import xllamacpp
    except ImportError as exc:
        print(f"xllamacpp is not installed: {exc}", file=sys.stderr)
        return EXIT_RUNTIME_MISSING

    api_key = os.environ.get(API_KEY_ENV, "")
    params = build_params(
        xllamacpp,
        model=args.model,
        threads=args.threads,
        ctx=args.ctx,
        alias=args.alias,
        api_key=api_key,
    )
    # Until Server() returns, SIGTERM keeps its default action (die at once): loading can take
    # seconds and there is nothing to clean up yet.
    try:
        server = xllamacpp.Server(params)
    except Exception as exc:  # xllamacpp raises RuntimeError; be broad, it is a C++ boundary
        print(f"llama.cpp could not load {args.model}: {exc}", file=sys.stderr)
        return EXIT_LOAD_FAILED

    # llama.cpp's init just installed its own SIGINT/SIGTERM handlers, which stop its loop but
    # leave this thread waiting forever. Take the signals back so one SIGTERM ends the process.
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)

    address = str(server.listening_address).rstrip("/")
    api_base = f"{address}/v1"
    try:
        port = _port_of(address)
        _wait_until_answers(api_base, api_key)
    except (ValueError, TimeoutError) as exc:
        print(f"embedded model server is not answering: {exc}", file=sys.stderr)
        _exit_soon_watchdog()
        del server
        return EXIT_LOAD_FAILED

    ready_out.write(json.dumps({"port": port, "api_base": api_base, "model": args.alias}) + "\n")
    ready_out.flush()

    # Signals that arrive while another thread runs are handled when this thread next wakes; the
    # timeout bounds that delay and doubles as the parent watch.
    while not stop.wait(PARENT_POLL_INTERVAL_S):
        if _parent_gone(args.parent_pid):
            break
    _exit_soon_watchdog()
    del server  # ~Server terminates the main loop and joins the HTTP thread
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
