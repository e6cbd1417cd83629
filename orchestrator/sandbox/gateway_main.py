"""The sandbox child process: one Jupyter Kernel Gateway, in-process, on a loopback port.

Run as ``python -P -m orchestrator.sandbox.gateway_main --runtime-dir DIR [...]`` with the auth
token in ``$PRIME_AGENT_GATEWAY_TOKEN``. Prints ONE JSON line ``{"port": N, "pid": P}`` on
stdout once the server accepts connections; everything else goes to stderr.

What it configures, and why (`docs/sandbox.md`, "Start-time tricks (measured)"):

- 127.0.0.1 only, an ephemeral port bound by us (no port-probing race), token auth.
- ``NoDelayWebsocketConnection``: jupyter_server never sets TCP_NODELAY on kernel websockets,
  and every reply is several small frames, so each round trip stalled ~40 ms on Nagle +
  delayed ACK (48 ms -> 9 ms per execute).
- IOPub rate limiting off: the default (1 MB/s) silently drops output; the host bounds output.
- Client-supplied kernel env: only the names the host whitelists (``--env-allow``); the gateway
  itself runs with a minimal environment, so nothing else can leak into the kernel.
- A kernelspec "prime-agent" written into the runtime dir: ipykernel with the in-kernel runtime
  loaded as an IPython extension, no colours, no history database.
- The kernel restarter polls every 0.5 s instead of 3 s, so a killed kernel is noticed quickly.
- Parent death: PR_SET_PDEATHSIG (``--die-with-parent``) plus a poll of the parent pid (the
  signal is tied to the parent *thread* and is lost across some exec paths).
- ``--files-root DIR``: the host moves files in and out of those directories through the
  gateway's own port and token (``gateway_files.py``; a Kubernetes pod cannot mount the host).
- Child subreaper: processes the kernel starts in their own sessions (``%%bash``, daemons) are
  re-parented to us, not to init, when their parent dies, so on the way out we can sweep every
  descendant and leave nothing behind (R8).

Kept cheap to start: nothing from the host side is imported (no pydantic, httpx).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import shutil
import signal
import sys
import warnings
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

__all__ = [
    "BASE_KERNEL_ENV_NAMES",
    "DEVICE_ENV_NAMES",
    "KERNEL_NAME",
    "TOKEN_ENV",
    "main",
    "read_token",
    "write_kernelspec",
]

TOKEN_ENV = "PRIME_AGENT_GATEWAY_TOKEN"
KERNEL_NAME = "prime-agent"
# Kernel env names the host always sends (POST /api/kernels "env"); the gateway drops any name
# that is neither KERNEL_* nor whitelisted.
BASE_KERNEL_ENV_NAMES = ("HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "LOGNAME", "TMPDIR")
# Copied from the gateway's own environment into every kernel's: which accelerators it may use
# and where their user-space libraries are (a local gateway gets them from the user's
# environment, a container from its image and ``--gpus``).
DEVICE_ENV_NAMES = (
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "LD_LIBRARY_PATH",
)
# Set in every kernel through the kernelspec: plain, non-interactive output.
KERNEL_FIXED_ENV = {
    "PYTHONUNBUFFERED": "1",  # child Pythons in %%bash stream instead of buffering
    "TERM": "dumb",
    "NO_COLOR": "1",
    "CLICOLOR": "0",
    "PAGER": "cat",
    "GIT_PAGER": "cat",
    "MPLBACKEND": "Agg",
}
PARENT_POLL_INTERVAL_S = 0.5
ORPHAN_REAP_INTERVAL_S = 1.0
KERNEL_RESTARTER_POLL_S = 0.5
# A restart asks the old kernel to exit, SIGTERMs it after half of this and SIGKILLs it at the
# end. The default (5 s) made every restart of a cell that ignores interrupts cost ~3 s; a
# healthy kernel exits within ~0.1 s of the request.
KERNEL_SHUTDOWN_WAIT_S = 1.0
LOG_LEVEL = "WARN"
SWEEPING_KERNEL_MANAGER = "orchestrator.sandbox.gateway_kernel.SweepingKernelManager"
DEFAULT_IP = "127.0.0.1"
RELAY_LISTEN_HOST = "127.0.0.1"
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

# The kernel's bootstrap: ipykernel_launcher's two lines, plus the orchestrator's source root
# appended to sys.path (lowest priority: it must never shadow the user's own modules) so the
# runtime imports even when the package is not installed in the kernel's interpreter.
#
# debugpy: ipykernel imports it at start for the (unused here) debugger protocol, ~0.2 s of a
# kernel start. A None entry in sys.modules makes that optional import fail (ipykernel catches
# ImportError and disables its debugger); the entry is removed again right after, so user code
# can still ``import debugpy``.
_KERNEL_BOOTSTRAP = (
    "import sys\n"
    "if {root!r} not in sys.path: sys.path.append({root!r})\n"
    "sys.modules['debugpy'] = None\n"
    "import ipykernel.debugger\n"
    "del sys.modules['debugpy']\n"
    "from ipykernel import kernelapp\n"
    "kernelapp.launch_new_instance()\n"
)


def write_kernelspec(kernels_dir: Path, python: str, ipython_dir: Path | None = None) -> Path:
    """Write the "prime-agent" kernelspec under ``kernels_dir``; return its directory.

    ``ipython_dir``: the kernel's IPYTHONDIR (a private one keeps the user's IPython profile and
    startup scripts out of the sandbox).
    """
    root = str(Path(__file__).resolve().parents[2])
    spec_dir = kernels_dir / KERNEL_NAME
    spec_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        python,
        "-P",  # no cwd on sys.path while ipykernel starts (a user's ``zmq.py`` must not win)
        "-c",
        _KERNEL_BOOTSTRAP.format(root=root),
        "-f",
        "{connection_file}",
        "--IPKernelApp.extensions=orchestrator.runtime",
        "--InteractiveShell.colors=nocolor",
        "--HistoryManager.enabled=False",
        f"--IPKernelApp.log_level={LOG_LEVEL}",
    ]
    spec = {
        "argv": argv,
        "display_name": "Prime Agent (Python)",
        "language": "python",
        "interrupt_mode": "signal",
        "env": {
            **KERNEL_FIXED_ENV,
            **({"IPYTHONDIR": str(ipython_dir)} if ipython_dir is not None else {}),
        },
        "metadata": {"debugger": False},
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec, indent=1))
    return spec_dir


def _prctl(option: int, value: int) -> None:
    # Same call as orchestrator.procs.set_parent_death_signal, inlined: importing procs would
    # pull in settings -> pydantic (+125 ms on every sandbox start).
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def _block_slow_optional_imports() -> None:
    # jupyter_events validates its schemas with jsonschema's format checkers, and jsonschema
    # imports the optional ``rfc3987_syntax`` for the "iri" formats; that module builds a Lark
    # grammar at import time, ~1.0 s of a ~1.5 s gateway boot. A None entry in sys.modules makes
    # ``import rfc3987_syntax`` raise ImportError, which jsonschema catches (it is optional:
    # `with suppress(ImportError)`), so only the "iri"/"iri-reference" checks are skipped, and
    # no schema the gateway uses has such a field. Measured: spawn -> ready 1.9 s -> 0.55 s.
    sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gateway_main")
    parser.add_argument("--runtime-dir", required=True, type=Path)
    parser.add_argument("--die-with-parent", action="store_true")
    parser.add_argument("--env-allow", action="append", default=[], metavar="NAME")
    parser.add_argument("--python", default=sys.executable)
    # Containers (docker backend, images/): listen on a fixed address, or on a Unix socket in a
    # bind-mounted directory; the defaults are the local backend's (loopback, OS-picked port).
    parser.add_argument("--ip", default=DEFAULT_IP)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--unix-socket", type=Path, default=None)
    # PORT=SOCKET: relay 127.0.0.1:PORT to a Unix socket (NATS for a container without network).
    parser.add_argument("--relay", action="append", default=[], metavar="PORT=SOCKET")
    # A Kubernetes pod: the token is a file of the session's Secret (docs/kubernetes.md).
    parser.add_argument("--token-file", type=Path, default=None)
    # Directories the host may move files in and out of over HTTP (gateway_files.py): a pod's
    # workspace, home, snapshot, skill and outputs directories. None: no files endpoint.
    parser.add_argument("--files-root", action="append", default=[], metavar="DIR")
    return parser.parse_args(argv)


def read_token(token_file: Path | None, environ: MutableMapping[str, str]) -> str:
    """The gateway's token: the file's first line when ``token_file`` is given, else
    ``$PRIME_AGENT_GATEWAY_TOKEN``; "" when there is none. The variable is removed from
    ``environ`` either way, so no kernel inherits it."""
    from_env = environ.pop(TOKEN_ENV, "")
    if token_file is None:
        return from_env
    try:
        lines = token_file.read_text(encoding="utf-8").splitlines()
    except OSError:
        return ""
    return lines[0].strip() if lines else ""


def _prepare_environment(runtime_dir: Path, python: str) -> None:
    # Every Jupyter directory inside the sandbox's runtime dir: no user config is read, the
    # kernelspec is found, connection files stay private and go away with the dir.
    runtime_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # a container's fresh /tmp
    for sub in ("config", "data", "runtime", "ipython"):
        (runtime_dir / sub).mkdir(mode=0o700, exist_ok=True)
    os.environ["JUPYTER_CONFIG_DIR"] = str(runtime_dir / "config")
    os.environ["JUPYTER_DATA_DIR"] = str(runtime_dir / "data")
    os.environ["JUPYTER_RUNTIME_DIR"] = str(runtime_dir / "runtime")
    os.environ["JUPYTER_PATH"] = str(runtime_dir / "data")
    os.environ["JUPYTER_PLATFORM_DIRS"] = "1"
    write_kernelspec(runtime_dir / "data" / "kernels", python, runtime_dir / "ipython")


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    original_ppid = os.getppid()
    if args.die_with_parent:
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != original_ppid:  # the parent died before the prctl took effect
            return 1
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    token = read_token(args.token_file, os.environ)
    if not token:
        where = args.token_file or f"${TOKEN_ENV}"
        print(f"gateway_main: no token in {where}", file=sys.stderr)
        return 2
    runtime_dir: Path = args.runtime_dir.resolve()
    _prepare_environment(runtime_dir, args.python)
    _block_slow_optional_imports()

    app = _make_app(
        token,
        env_allow=args.env_allow,
        runtime_dir=runtime_dir,
        ip=args.ip,
        port=args.port,
        unix_socket=args.unix_socket,
    )
    if args.files_root:
        from orchestrator.sandbox.gateway_files import install_files_handler

        install_files_handler(app.web_app, args.files_root)
    io_loop = app.io_loop
    for relay in args.relay:
        io_loop.add_callback(_start_relay, relay)

    def announce() -> None:
        print(json.dumps({"port": app.port, "pid": os.getpid()}), flush=True)

    io_loop.add_callback(announce)
    callbacks = [_periodic(lambda: _reap_orphans(app), ORPHAN_REAP_INTERVAL_S)]
    if args.die_with_parent:

        def check_parent() -> None:
            if os.getppid() != original_ppid:
                app.stop()

        callbacks.append(_periodic(check_parent, PARENT_POLL_INTERVAL_S))
    try:
        app.start()
    finally:
        for cb in callbacks:
            cb.stop()
        _sweep_descendants()
        if os.getppid() != original_ppid:
            # Our parent died without stopping us, so nobody else will remove the runtime dir
            # (kernelspec, connection files, log). A living parent removes it itself after
            # reading the log.
            shutil.rmtree(runtime_dir, ignore_errors=True)
    return 0


async def _start_relay(spec: str) -> None:
    from orchestrator.sandbox.relay import serve_tcp_to_unix

    port, _, socket_path = spec.partition("=")
    await serve_tcp_to_unix(RELAY_LISTEN_HOST, int(port), Path(socket_path))


def _periodic(fn: Any, interval_s: float) -> Any:
    from tornado.ioloop import PeriodicCallback

    cb = PeriodicCallback(fn, interval_s * 1000)
    cb.start()
    return cb


def _kernel_pids(app: Any) -> set[int]:
    pids: set[int] = set()
    km = app.kernel_manager
    for kernel_id in list(km.list_kernel_ids()):
        with contextlib.suppress(Exception):
            pid = km.get_kernel(kernel_id).provisioner.pid
            if pid:
                pids.add(int(pid))
    return pids


def _reap_orphans(app: Any) -> None:
    # As subreaper we inherit orphans; wait for the dead ones so they do not stay zombies. Never
    # wait for a kernel: jupyter_client's Popen owns that exit status.
    from orchestrator.sandbox.proctree import children

    kernels = _kernel_pids(app)
    for info in children(os.getpid()):
        if info.state == "Z" and info.pid not in kernels:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(info.pid, os.WNOHANG)


def _sweep_descendants() -> None:
    from orchestrator.sandbox.proctree import sweep_descendants

    sweep_descendants(os.getpid())


def _make_app(
    token: str,
    *,
    env_allow: list[str],
    runtime_dir: Path,
    ip: str = DEFAULT_IP,
    port: int = 0,
    unix_socket: Path | None = None,
) -> Any:
    from jupyter_server.services.kernels.connection.channels import (
        ZMQChannelsWebsocketConnection,
    )
    from kernel_gateway.gatewayapp import KernelGatewayApp
    from tornado import netutil
    from traitlets.config import Config

    class NoDelayWebsocketConnection(ZMQChannelsWebsocketConnection):
        def connect(self) -> Any:
            self.websocket_handler.set_nodelay(True)
            return super().connect()

    class PrimeGatewayApp(KernelGatewayApp):  # type: ignore[misc]
        def init_http_server(self) -> None:
            # Bind port 0 ourselves: the kernel picks a free port atomically (no probe-then-
            # bind race between sandboxes starting at the same moment).
            from tornado import httpserver

            self.http_server = httpserver.HTTPServer(self.web_app)
            if unix_socket is not None:
                # Any uid may connect: the socket's (bind-mounted) directory guards access,
                # and the token still authenticates every request.
                sock = netutil.bind_unix_socket(str(unix_socket), mode=0o666)
                self.http_server.add_sockets([sock])
                self.port = 0
                return
            sockets = netutil.bind_sockets(port, ip)
            self.http_server.add_sockets(sockets)
            self.port = sockets[0].getsockname()[1]

        def init_signal(self) -> None:
            # SIGTERM/SIGQUIT stop the server (and its kernels) cleanly; SIGINT is not ours.
            signal.signal(signal.SIGTERM, self._signal_stop)
            signal.signal(signal.SIGQUIT, self._signal_stop)
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    cfg = Config()
    cfg.KernelGatewayApp.ip = ip
    cfg.KernelGatewayApp.auth_token = token
    cfg.KernelGatewayApp.kernel_websocket_connection_class = NoDelayWebsocketConnection
    cfg.KernelGatewayApp.default_kernel_name = KERNEL_NAME
    cfg.KernelGatewayApp.force_kernel_name = KERNEL_NAME
    cfg.KernelGatewayApp.max_kernels = 1  # one sandbox, one kernel
    cfg.KernelGatewayApp.log_level = LOG_LEVEL
    cfg.JupyterWebsocketPersonality.list_kernels = True
    cfg.JupyterWebsocketPersonality.env_whitelist = [*BASE_KERNEL_ENV_NAMES, *env_allow]
    cfg.KernelGatewayApp.env_process_whitelist = list(DEVICE_ENV_NAMES)
    cfg.ZMQChannelsWebsocketConnection.limit_rate = False
    cfg.KernelRestarter.time_to_dead = KERNEL_RESTARTER_POLL_S
    cfg.KernelManager.shutdown_wait_time = KERNEL_SHUTDOWN_WAIT_S
    # A kernel that stops (restart, death, shutdown) takes everything it left behind with it.
    # (jupyter_server warns that the class does not derive from its ServerKernelManager; the
    # gateway's own default does not either.)
    warnings.filterwarnings("ignore", "KernelManager class", FutureWarning)
    cfg.SeedingMappingKernelManager.kernel_manager_class = SWEEPING_KERNEL_MANAGER
    # Kernel cwd: the host POSTs "path" = the session cwd relative to "/".
    cfg.MappingKernelManager.root_dir = "/"
    app = PrimeGatewayApp(config=cfg)
    app.initialize(argv=[])
    # traitlets leaves the application's logger at DEBUG and filters in its handler: every
    # debug call still built a record and walked the handlers, the kernel manager's
    # ``record_activity`` once per kernel message (~7 % of a busy gateway's CPU).
    app.log.setLevel(LOG_LEVEL)
    return app


if __name__ == "__main__":
    sys.exit(main())
