"""Every attack of docs/security.md that holds on docker, run from inside a bwrap sandbox's kernel.

Each attack is a cell sent through ``Sandbox.execute``, as a hostile model would send it. The
tests are parametrized over two backends:

- ``bwrap-blocks``: the bubblewrap backend (``orchestrator/sandbox/bwrap.py``); the attack must
  fail.
- ``local-attack-works``: the unsandboxed local backend, which is what ``--backend auto`` gave
  on a machine without Docker before issue 16. The same cell must SUCCEED there: this is the
  reproduction of the attack on the old behaviour, and it proves each bwrap assertion is not
  vacuous. These cases are kept cheap and harmless to the host: no fork bomb and no memory hog
  outside a sandbox (they only show that the limits are absent), and every file they manage
  to write outside the workspace is removed again.

The host side, standing for the daemon, is a module fixture (``host``): a fake provider key in
this process's environment and in the exec environment of a second host process (a process's
``/proc/PID/environ`` shows what it was started with, so that second process is the
daemon-like target of the scan); a DuckDB store file and a real embedded NATS server, whose
``nats-server.json`` holds the admin password, under a private state directory laid out as
``orchestrator/paths.py`` lays out the daemon's; and the scripted model server on a loopback
port. Speed is measured in ``bench/bench_bwrap.py``, never here.

With CI=true a missing bwrap, or a limit the host cannot enforce (no cgroup), fails instead of
skipping (``tests.helpers.need``).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
import pytest_asyncio

from orchestrator.bus.credentials import SessionCredentials
from orchestrator.bus.server import EmbeddedNats
from orchestrator.ids import new_session_id
from orchestrator.paths import Paths
from orchestrator.sandbox.base import ResourceLimits, Sandbox, SandboxBackend, SandboxSpec
from orchestrator.sandbox.bwrap_probe import bwrap_usable
from orchestrator.testing import FakeModelServer
from tests.helpers import need

pytestmark = [
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="linux only"),
    pytest.mark.timeout(300),
]

CAP: Final = 4096
GRACE_S: Final = 1.0
CELL_TIMEOUT_S: Final = 60.0
SANDBOX_UID: Final = 1000  # a root-owned workspace is handed to the sandbox's user
KEY_VAR: Final = "OPENAI_API_KEY"
DOCKER_SOCKETS: Final = ("/var/run/docker.sock", "/run/docker.sock")
INSIDE_NATS_URL: Final = "nats://127.0.0.1:4222"  # the relay, as in a docker container
# The limits of the containment tests: a sandbox at rest (gateway + kernel) fits well within.
LIMIT_PIDS: Final = 64
LIMIT_MEMORY_BYTES: Final = 256 * 1024**2
OVER_LIMIT_FACTOR: Final = 2  # the attack asks for this many times the limit
BOMB_TIMEOUT_S: Final = 3.0
SETTLE_TIMEOUT_S: Final = 20.0  # the gateway reaps what a killed bomb left
HOST_STOP_TIMEOUT_S: Final = 10.0
# /proc/net/tcp: state 0A is LISTEN; addresses reachable from loopback.
TCP_LISTEN: Final = "0A"
LOOPBACK_HEX: Final = ("0100007F", "00000000")
LOOPBACK6_HEX: Final = ("00000000000000000000000001000000", "00000000000000000000000000000000")
# More listening ports than a sandbox's own (relay + the kernel's five ZMQ ports) would mean
# its network is the host's.
MAX_OWN_LISTENERS: Final = 8


def _bwrap_missing() -> str | None:
    """None when bwrap runs a sandbox here, else why not (the backend's own probe)."""
    usable, why = bwrap_usable()
    return None if usable else why


def workspace(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    if os.getuid() == 0:
        os.chown(path, SANDBOX_UID, SANDBOX_UID)
    return path


# --- the cells ---------------------------------------------------------------------------------

# Shared by every cell: small probes that report instead of raising.
PRELUDE: Final = r'''
import ctypes, json, os, socket, subprocess, sys
def can_connect(host, port, timeout=2.0):
    try:
        socket.create_connection((host, port), timeout=timeout).close()
        return True
    except OSError:
        return False
def try_read(path):
    try:
        with open(path, 'rb') as fh:
            return fh.read()
    except OSError as exc:
        return type(exc).__name__
def try_create(path, keep=False):
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        return type(exc).__name__
    os.close(fd)
    if not keep:
        os.unlink(path)
    return True
def nats_login(host, port, user, password):
    """The server's first reply to CONNECT + PING: 'PONG' or '-ERR ...'; or why no server."""
    try:
        sock = socket.create_connection((host, port), timeout=5)
    except OSError as exc:
        return type(exc).__name__
    with sock, sock.makefile('rb') as lines:
        info = lines.readline()
        if not info.startswith(b'INFO '):
            return 'no INFO line'
        options = {'verbose': False, 'pedantic': False, 'user': user, 'pass': password}
        sock.sendall(b'CONNECT ' + json.dumps(options).encode() + b'\r\nPING\r\n')
        return lines.readline().decode().strip()
def nats_server_id(host, port):
    try:
        sock = socket.create_connection((host, port), timeout=5)
    except OSError as exc:
        return type(exc).__name__
    with sock, sock.makefile('rb') as lines:
        return json.loads(lines.readline()[len(b'INFO '):])['server_id']
def listening_ports():
    ports = set()
    for name in ('/proc/net/tcp', '/proc/net/tcp6'):
        try:
            rows = open(name).read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[3] == '0A':
                ports.add(int(fields[1].rsplit(':', 1)[1], 16))
    return sorted(ports)
def in_child(source):
    """Run ``source`` in a fresh python (changes of uid or namespace stay out of the kernel)."""
    done = subprocess.run([sys.executable, '-c', source], capture_output=True, text=True)
    return {'rc': done.returncode, 'out': done.stdout.strip(), 'err': done.stderr.strip()[-200:]}
'''


def cell(body: str, **args: Any) -> str:
    """A cell: the prelude, ``ARGS`` (JSON-safe values), then ``body``, which prints one JSON
    line as its last output."""
    return f"{PRELUDE}\nARGS = json.loads({json.dumps(args)!r})\n{body}"


async def run_json(sandbox: Sandbox, body: str, *, cell_id: str, **args: Any) -> dict[str, Any]:
    result = await sandbox.execute(cell(body, **args), timeout_s=CELL_TIMEOUT_S, cell_id=cell_id)
    assert result.status == "ok", result
    out: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return out


# --- the host side (the daemon's stand-in) -----------------------------------------------------


@dataclass
class Host:
    key: str
    keyed_process: subprocess.Popen[bytes]  # started with the key in its environment
    paths: Paths  # the daemon's state layout (config, data, runtime)
    nats: EmbeddedNats
    nats_port: int
    nats_server_id: str
    model: FakeModelServer
    model_port: int

    @property
    def nats_state_file(self) -> Path:
        return self.nats.runtime_dir / "nats-server.json"


def _host_listening_ports() -> list[int]:
    """TCP ports listening on the host's loopback or on every address (from this process's
    network namespace, which is the host's)."""
    ports: set[int] = set()
    for name, reachable in (("/proc/net/tcp", LOOPBACK_HEX), ("/proc/net/tcp6", LOOPBACK6_HEX)):
        try:
            rows = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in rows:
            fields = line.split()
            address, port = fields[1].rsplit(":", 1)
            if fields[3] == TCP_LISTEN and address in reachable:
                ports.add(int(port, 16))
    return sorted(ports)


def _host_net_ns() -> str:
    return os.readlink("/proc/self/ns/net")


def _nats_info_server_id(port: int) -> str:
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        line = sock.makefile("rb").readline()
    server_id: str = json.loads(line[len(b"INFO ") :])["server_id"]
    return server_id


def _make_store(paths: Paths) -> None:
    import duckdb

    paths.data_dir.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect(str(paths.database_file))
    try:
        con.execute("CREATE TABLE secrets (value VARCHAR)")
        con.execute("INSERT INTO secrets VALUES ('the store')")
        con.execute("CHECKPOINT")
    finally:
        con.close()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def host(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Host]:
    root = tmp_path_factory.mktemp("daemon-state")
    paths = Paths(
        config_dir=root / "config" / "prime-agent",
        data_dir=root / "data" / "prime-agent",
        cache_dir=root / "cache" / "prime-agent",
        runtime_dir=root / "run" / "prime-agent",
    )
    paths.config_dir.mkdir(parents=True)
    paths.config_file.write_text('[sandbox]\nbackend = "bwrap"\n')
    _make_store(paths)
    key = f"sk-test-{secrets.token_hex(16)}"
    old_key = os.environ.get(KEY_VAR)
    os.environ[KEY_VAR] = key  # in the environment every sandbox is started from
    keyed = subprocess.Popen(
        ["sleep", "3600"], env={"PATH": os.environ.get("PATH", ""), KEY_VAR: key}
    )
    nats = EmbeddedNats.from_paths(paths, instance="main")
    model = FakeModelServer().start()
    try:
        await nats.start()
        port = int(nats.url.rsplit(":", 1)[1])
        yield Host(
            key=key,
            keyed_process=keyed,
            paths=paths,
            nats=nats,
            nats_port=port,
            nats_server_id=await asyncio.to_thread(_nats_info_server_id, port),
            model=model,
            model_port=model.port,
        )
    finally:
        await nats.stop()
        await asyncio.to_thread(model.close)
        keyed.kill()
        keyed.wait(HOST_STOP_TIMEOUT_S)
        if old_key is None:
            os.environ.pop(KEY_VAR, None)
        else:
            os.environ[KEY_VAR] = old_key


@pytest.fixture(autouse=True)
def _key_in_environment(host: Host, monkeypatch: pytest.MonkeyPatch) -> None:
    """conftest removes provider keys for every test; here the key must stay in the host's
    environment, as it is in the daemon's."""
    monkeypatch.setenv(KEY_VAR, host.key)


# --- the backends and sandboxes ----------------------------------------------------------------

BACKENDS: Final = (
    pytest.param("bwrap", id="bwrap-blocks"),
    pytest.param("local", id="local-attack-works"),
)


def _new_backend(kind: str) -> SandboxBackend:
    if kind == "bwrap":
        why = _bwrap_missing()
        if why is not None:
            need("bwrap", why)
        from orchestrator.sandbox.bwrap import BwrapBackend

        return BwrapBackend(pool_size=0, interrupt_grace_s=GRACE_S, output_cap_chars=CAP)
    from orchestrator.sandbox.local import LocalBackend

    return LocalBackend(pool_size=0, interrupt_grace_s=GRACE_S, output_cap_chars=CAP)


def _spec(
    base: Path,
    name: str,
    *,
    env: dict[str, str] | None = None,
    mode: str | None = None,
    network: bool | None = None,
    limits: ResourceLimits | None = None,
    cwd: Path | None = None,
) -> SandboxSpec:
    return SandboxSpec(
        session_id=new_session_id(),
        cwd=workspace(cwd if cwd is not None else base / f"{name}-ws"),
        artifacts_dir=base / f"{name}-art",
        env=env or {},
        workspace=mode,  # type: ignore[arg-type]
        network=network,
        limits=limits,
    )


@dataclass
class World:
    """One backend's sandboxes: ``probe`` (rw workspace, the session's NATS credentials) and
    ``peer`` (another session, its workspace read-only)."""

    kind: str
    backend: SandboxBackend
    probe: Sandbox
    peer: Sandbox
    creds: SessionCredentials
    base: Path

    @property
    def bwrap(self) -> bool:
        return self.kind == "bwrap"


@pytest_asyncio.fixture(loop_scope="module", scope="module", params=BACKENDS)
async def world(
    request: pytest.FixtureRequest, host: Host, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[World]:
    kind: str = request.param
    backend = _new_backend(kind)
    base = tmp_path_factory.mktemp(f"world-{kind}")
    creds = await host.nats.add_session_user(new_session_id())
    probe_spec = _spec(base, "probe", env=creds.env())
    peer_spec = _spec(base, "peer", mode="ro")
    (peer_spec.cwd / "peer-secret.txt").write_text("peer's work\n")
    try:
        probe = await backend.create(probe_spec)
        peer = await backend.create(peer_spec)
        yield World(kind, backend, probe, peer, creds, base)
    finally:
        await backend.close()
        await host.nats.remove_session_user(creds.session_id)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def bwrap_backend() -> AsyncIterator[SandboxBackend]:
    backend = _new_backend("bwrap")
    yield backend
    await backend.close()


# --- the attacks -------------------------------------------------------------------------------


async def test_the_provider_key_is_in_no_environment(world: World, host: Host) -> None:
    keyed_pid = host.keyed_process.pid
    # Not vacuous: the host process the cell looks for really carries the key.
    assert host.key.encode() in Path(f"/proc/{keyed_pid}/environ").read_bytes()
    half = len(host.key) // 2
    body = r"""
key = (ARGS['a'] + ARGS['b']).encode()
hits = ['own env'] if any(key in v.encode() for v in os.environ.values()) else []
seen = 0
for pid in os.listdir('/proc'):
    if pid.isdigit():
        seen += 1
        for name in ('environ', 'cmdline'):
            data = try_read(f'/proc/{pid}/{name}')
            if isinstance(data, bytes) and key in data:
                hits.append(f'{pid}/{name}')
direct = {}
for pid in ARGS['host_pids']:
    data = try_read(f'/proc/{pid}/environ')
    direct[str(pid)] = (key in data) if isinstance(data, bytes) else data
files = []
if ARGS['scan_files']:
    # Every file the sandbox sees but the host's system and interpreter trees (host files that
    # no backend writes to): its root, /etc, /tmp, HOME, /run, the workspace, the outputs.
    import orchestrator
    skip = ('/proc', '/sys', '/dev', '/usr', sys.prefix, sys.base_prefix,
            os.path.dirname(os.path.dirname(orchestrator.__file__)))
    for top, dirs, names in os.walk('/'):
        dirs[:] = [d for d in dirs if not os.path.join(top, d).startswith(skip)]
        for name in names:
            data = try_read(os.path.join(top, name))
            if isinstance(data, bytes) and key in data:
                files.append(os.path.join(top, name))
print(json.dumps({'hits': hits, 'direct': direct, 'processes': seen, 'files': files}))
"""
    out = await run_json(
        world.probe,
        body,
        cell_id="key",
        a=host.key[:half],
        b=host.key[half:],
        host_pids=[os.getpid(), keyed_pid],
        scan_files=world.bwrap,  # the host's whole tree is too big to read on local
    )
    if world.bwrap:
        assert out["hits"] == [] and out["files"] == [], out
        assert True not in out["direct"].values(), out
    else:
        assert f"{keyed_pid}/environ" in out["hits"], out
        assert out["direct"][str(keyed_pid)] is True, out


STATE_BODY: Final = r"""
found = {}
for name, path in ARGS['files'].items():
    data = try_read(path)
    found[name] = 'read' if isinstance(data, bytes) else data
duck = try_read(ARGS['files']['store'])
state = try_read(ARGS['files']['nats_state'])
admin_password = json.loads(state)['admin_password'] if isinstance(state, bytes) else None
listed = {}
for name, path in ARGS['dirs'].items():
    try:
        listed[name] = sorted(os.listdir(path))
    except OSError as exc:
        listed[name] = type(exc).__name__
port = ARGS['nats_port']
out = {
    'found': found,
    'listed': listed,
    'store_is_duckdb': isinstance(duck, bytes) and b'DUCK' in duck[:64],
    'has_admin_password': admin_password is not None,
    'host_port_reachable': can_connect('127.0.0.1', port),
    'admin_on_host_port': nats_login('127.0.0.1', port, 'admin', admin_password or ''),
    'nats_url': os.environ.get('PRIME_AGENT_NATS_URL'),
}
if out['nats_url'] == ARGS['inside_url']:
    out['relay_server_id'] = nats_server_id('127.0.0.1', 4222)
    out['admin_through_relay'] = nats_login('127.0.0.1', 4222, 'admin', admin_password or '')
    out['self_through_relay'] = nats_login(
        '127.0.0.1', 4222, os.environ['PRIME_AGENT_NATS_USER'],
        os.environ['PRIME_AGENT_NATS_PASSWORD'])
print(json.dumps(out))
"""


async def test_the_store_and_the_nats_state_are_out_of_reach(world: World, host: Host) -> None:
    paths = host.paths
    files = {
        "store": str(paths.database_file),
        "config": str(paths.config_file),
        "nats_state": str(host.nats_state_file),
        "nats_config": str(host.nats.config_path),
    }
    dirs = {
        "data": str(paths.data_dir),
        "runtime": str(paths.runtime_dir),
        "jetstream": str(host.nats.store_dir),
    }
    for path in files.values():  # not vacuous: they are all there, on the host
        assert Path(path).is_file(), path
    out = await run_json(
        world.probe,
        STATE_BODY,
        cell_id="state",
        files=files,
        dirs=dirs,
        nats_port=host.nats_port,
        inside_url=INSIDE_NATS_URL,
    )
    if world.bwrap:
        assert set(out["found"].values()) <= {"FileNotFoundError", "PermissionError"}, out
        assert set(out["listed"].values()) <= {"FileNotFoundError", "PermissionError"}, out
        assert not out["store_is_duckdb"] and not out["has_admin_password"], out
        # The server itself is out of reach: only the session's relay leads to it ...
        assert out["host_port_reachable"] is False, out
        assert out["admin_on_host_port"] == "ConnectionRefusedError", out
        assert out["nats_url"] == INSIDE_NATS_URL, out
        # ... and the relay leads to this server only, where the kernel is its own user.
        assert out["relay_server_id"] == host.nats_server_id, out
        assert out["self_through_relay"] == "PONG", out
        assert out["admin_through_relay"].startswith("-ERR"), out
    else:
        assert out["found"]["store"] == "read" and out["store_is_duckdb"], out
        assert out["has_admin_password"], out
        assert out["admin_on_host_port"] == "PONG", out  # logged in as admin


PORTS_BODY: Final = r"""
# The sandbox's own listeners (its relay, the kernel's ports) are not the host's; in the host's
# network namespace every listener is the host's.
net_ns = os.readlink('/proc/self/ns/net')
own = listening_ports() if net_ns != ARGS['host_net_ns'] else []
tried = [p for p in ARGS['ports'] if p not in own]
reachable = [p for p in tried if can_connect('127.0.0.1', p)]
print(json.dumps({
    'own': own,
    'tried': tried,
    'reachable': reachable,
    'net_ns': net_ns,
    'outside': can_connect('1.1.1.1', 53) or can_connect('8.8.8.8', 53),
}))
"""


async def test_host_loopback_ports_are_unreachable(world: World, host: Host) -> None:
    ports = _host_listening_ports()
    assert host.model_port in ports and host.nats_port in ports, ports
    out = await run_json(
        world.probe, PORTS_BODY, cell_id="ports", ports=ports, host_net_ns=_host_net_ns()
    )
    assert host.model_port in out["tried"], out  # the scripted model's port was attacked
    if world.bwrap:
        assert out["reachable"] == [], out
        assert out["net_ns"] != _host_net_ns(), out
        assert len(out["own"]) <= MAX_OWN_LISTENERS, out
        assert out["outside"] is False, out
    else:
        assert host.model_port in out["reachable"] and host.nats_port in out["reachable"], out


async def test_network_on_reaches_the_host(
    bwrap_backend: SandboxBackend, host: Host, tmp_path: Path
) -> None:
    """The policy works both ways: with network on, the same port is reachable."""
    sandbox = await bwrap_backend.create(_spec(tmp_path, "net", network=True))
    try:
        out = await run_json(
            sandbox,
            PORTS_BODY,
            cell_id="ports",
            ports=[host.model_port],
            host_net_ns=_host_net_ns(),
        )
    finally:
        await sandbox.stop()
    assert out["reachable"] == [host.model_port], out
    assert out["net_ns"] == _host_net_ns(), out


async def test_the_docker_socket_is_absent(world: World) -> None:
    on_host = [p for p in DOCKER_SOCKETS if os.path.exists(p)]
    body = r"""
import socket as s
out = {}
for path in ARGS['sockets']:
    sock = s.socket(s.AF_UNIX, s.SOCK_STREAM)
    try:
        sock.connect(path)
        out[path] = 'connected'
    except OSError as exc:
        out[path] = type(exc).__name__
    finally:
        sock.close()
print(json.dumps(out))
"""
    out = await run_json(world.probe, body, cell_id="docker", sockets=list(DOCKER_SOCKETS))
    if world.bwrap:
        assert set(out.values()) == {"FileNotFoundError"}, out
    else:
        if not on_host:
            need("docker", "no docker socket on this host: nothing to reproduce")
        assert "connected" in out.values(), out


WRITES_BODY: Final = r"""
m = ARGS['marker']
print(json.dumps({
    'root': try_create('/' + m),
    'usr': try_create('/usr/' + m),
    'etc': try_create('/etc/' + m),
    'host_home': try_create(os.path.join(ARGS['host_home'], m), keep=True),
    'home': try_create(os.path.join(os.environ['HOME'], m), keep=True),
    'tmp': try_create('/tmp/' + m, keep=True),
    'workspace': try_create(m, keep=True),
    'home_dir': os.environ['HOME'],
}))
"""


async def test_writes_outside_the_workspace_are_refused_or_private(world: World) -> None:
    marker = f"prime-agent-attack-{secrets.token_hex(6)}"
    host_home = Path.home()
    left = [Path("/tmp") / marker, host_home / marker]
    try:
        out = await run_json(
            world.probe, WRITES_BODY, cell_id="writes", marker=marker, host_home=str(host_home)
        )
        on_host = {str(p): p.exists() for p in left}
        if world.bwrap:
            assert out["root"] != True and out["usr"] != True and out["etc"] != True, out  # noqa: E712
            assert out["host_home"] != True, out  # noqa: E712
            # A private, writable /tmp and HOME; the host's stay unchanged.
            assert out["tmp"] is True and out["home"] is True, out
            assert out["home_dir"] != str(host_home), out
            assert on_host == {str(p): False for p in left}, on_host
        else:
            assert out["root"] is True and out["usr"] is True and out["etc"] is True, out
            assert on_host[str(Path("/tmp") / marker)], on_host
        assert out["workspace"] is True, out
        assert (world.probe.spec.cwd / marker).is_file()
    finally:
        for path in left:
            path.unlink(missing_ok=True)


async def test_a_read_only_workspace_refuses_writes(world: World) -> None:
    body = r"""
print(json.dumps({
    'read': try_read('peer-secret.txt').decode(),
    'write': try_create('new-file'),
    'cwd': os.getcwd(),
}))
"""
    out = await run_json(world.peer, body, cell_id="ro")
    assert out["read"] == "peer's work\n", out
    assert out["cwd"] == str(world.peer.spec.cwd), out
    if world.bwrap:
        assert out["write"] != True, out  # noqa: E712
        assert not (world.peer.spec.cwd / "new-file").exists()
    else:  # the local backend's ro only warns
        assert out["write"] is True, out


ROOT_BODY: Final = r"""
status = dict(line.split(':\t', 1) for line in open('/proc/self/status').read().splitlines()
              if ':\t' in line)
UNSHARE = '''
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
sys.exit(0 if libc.unshare(0x10000000) == 0 else ctypes.get_errno())
'''
# A new mount namespace made private first (where that works, nothing reaches the host), then
# a tmpfs mounted, unmounted and its directory removed.
MOUNT = '''
import ctypes, os, sys, tempfile
libc = ctypes.CDLL(None, use_errno=True)
own_ns = libc.unshare(0x00020000) == 0
if own_ns and libc.mount(None, b"/", None, 16384 | (1 << 18), None) != 0:
    sys.exit(100)
target = tempfile.mkdtemp()
rc = libc.mount(b"none", target.encode(), b"tmpfs", 0, None)
err = ctypes.get_errno()
if rc == 0:
    libc.umount2(target.encode(), 2)
os.rmdir(target)
sys.exit(0 if rc == 0 else err)
'''
print(json.dumps({
    'uid': os.getuid(),
    'euid': os.geteuid(),
    'cap_eff': int(status['CapEff'], 16),
    'cap_prm': int(status['CapPrm'], 16),
    'setuid0': in_child('import os; os.setuid(0)'),
    'userns': in_child(UNSHARE),
    'mount': in_child(MOUNT),
}))
"""


async def test_no_root_and_no_capabilities(world: World) -> None:
    out = await run_json(world.probe, ROOT_BODY, cell_id="root")
    if world.bwrap:
        assert out["uid"] != 0 and out["euid"] != 0, out
        assert out["cap_eff"] == 0 and out["cap_prm"] == 0, out
        assert out["setuid0"]["rc"] != 0, out
        assert out["userns"]["rc"] != 0, out  # new user namespaces are disabled
        assert out["mount"]["rc"] != 0, out
    else:
        assert out["uid"] == 0 and out["cap_eff"] != 0, out
        assert out["userns"]["rc"] == 0 and out["mount"]["rc"] == 0, out


async def test_other_sessions_workspaces_are_invisible(world: World) -> None:
    probe_ws, peer_ws = world.probe.spec.cwd, world.peer.spec.cwd
    (probe_ws / "probe-secret.txt").write_text("probe's work\n")
    body = r"""
out = {}
for name in ('file', 'dir'):
    path = ARGS[name]
    if name == 'file':
        data = try_read(path)
        out[name] = data.decode() if isinstance(data, bytes) else data
    else:
        try:
            out[name] = sorted(os.listdir(path))
        except OSError as exc:
            out[name] = type(exc).__name__
print(json.dumps(out))
"""
    from_probe = await run_json(
        world.probe, body, cell_id="peer", file=str(peer_ws / "peer-secret.txt"), dir=str(peer_ws)
    )
    from_peer = await run_json(
        world.peer,
        body,
        cell_id="probe",
        file=str(probe_ws / "probe-secret.txt"),
        dir=str(probe_ws),
    )
    if world.bwrap:
        assert from_probe == {"file": "FileNotFoundError", "dir": "FileNotFoundError"}
        assert from_peer == {"file": "FileNotFoundError", "dir": "FileNotFoundError"}
    else:
        assert from_probe["file"] == "peer's work\n", from_probe
        assert from_peer["file"] == "probe's work\n", from_peer


@pytest.mark.parametrize("kind", BACKENDS)
async def test_state_dirs_inside_the_workspace_are_hidden(
    kind: str, isolated_env: Path, tmp_path: Path
) -> None:
    """A project directory that holds the orchestrator's own state (a session started in
    ``$HOME``, whose ``.local/share`` is the data dir): the state stays hidden inside."""
    paths = Paths.from_env()
    _make_store(paths)
    paths.config_dir.mkdir(parents=True, exist_ok=True)
    paths.config_file.write_text("[sandbox]\n")
    assert paths.database_file.is_relative_to(tmp_path)
    if os.getuid() == 0:
        # As a non-root user the sandbox runs as that user, who owns the state: give the whole
        # tree to the sandbox's uid so only the hiding (not the modes) can keep it out.
        for directory, _, names in os.walk(tmp_path):
            os.chown(directory, SANDBOX_UID, SANDBOX_UID)
            for name in names:
                os.chown(os.path.join(directory, name), SANDBOX_UID, SANDBOX_UID)
    backend = _new_backend(kind)
    try:
        sandbox = await backend.create(_spec(tmp_path, "home", cwd=tmp_path))
        body = r"""
print(json.dumps({name: (lambda d: 'read' if isinstance(d, bytes) else d)(try_read(path))
                  for name, path in ARGS['files'].items()}))
"""
        files = {"store": str(paths.database_file), "config": str(paths.config_file)}
        out = await run_json(sandbox, body, cell_id="hidden", files=files)
    finally:
        await backend.close()
    if kind == "bwrap":
        assert set(out.values()) <= {"FileNotFoundError", "PermissionError"}, out
    else:
        assert out == {"store": "read", "config": "read"}, out


# --- limits: fork bomb and memory hog ----------------------------------------------------------

SMALL_LIMITS: Final = ResourceLimits(memory_bytes=LIMIT_MEMORY_BYTES, pids=LIMIT_PIDS)
LIMIT_NAMES: Final = {"memory": "memory", "pids": "pids"}


def _confinement_missing(sandbox: Sandbox) -> tuple[tuple[str, ...], str]:
    """(limits the sandbox's confinement does not enforce, its one-line warning)."""
    confinement = getattr(sandbox, "confinement", None)
    assert confinement is not None, f"{type(sandbox).__name__} has no confinement"
    return tuple(confinement.missing), str(confinement.warning)


def _report_missing(sandbox: Sandbox, wanted: str) -> None:
    """Where the host gives no cgroup for ``wanted``, the backend's warning must say so in one
    line; the test then reports it (a skip, or a failure with CI=true), never passes."""
    missing, warning = _confinement_missing(sandbox)
    if wanted in missing:
        assert wanted in warning and "\n" not in warning.strip(), warning
        need(f"a cgroup for the {wanted} limit", warning)


THREADS_BODY: Final = r"""
import threading
stop = threading.Event()
started, error = 0, None
threads = []
try:
    for _ in range(ARGS['count']):
        t = threading.Thread(target=stop.wait)
        t.start()
        threads.append(t)
        started += 1
except RuntimeError as exc:
    error = str(exc)
stop.set()
for t in threads:
    t.join()
print(json.dumps({'started': started, 'error': error}))
"""

MEMORY_BODY: Final = r"""
try:
    block = bytearray(ARGS['bytes'])
    block[::4096] = b'x' * len(block[::4096])  # touch every page
    got = len(block)
    del block
except MemoryError:
    got = 'MemoryError'
print(json.dumps({'got': got}))
"""


@pytest.mark.parametrize("kind", BACKENDS)
async def test_pids_and_memory_limits_hold(kind: str, tmp_path: Path) -> None:
    """Twice the pids limit in threads, twice the memory limit in one block. On local both
    succeed (no limit at all; the amounts are harmless to the host)."""
    backend = _new_backend(kind)
    try:
        sandbox = await backend.create(_spec(tmp_path, "limits", limits=SMALL_LIMITS))
        count = OVER_LIMIT_FACTOR * LIMIT_PIDS
        threads = await run_json(sandbox, THREADS_BODY, cell_id="threads", count=count)
        size = OVER_LIMIT_FACTOR * LIMIT_MEMORY_BYTES
        memory = await sandbox.execute(
            cell(MEMORY_BODY, bytes=size), timeout_s=CELL_TIMEOUT_S, cell_id="memory"
        )
        after = await sandbox.execute("1 + 1", timeout_s=CELL_TIMEOUT_S, cell_id="after")
        if kind == "bwrap":
            _report_missing(sandbox, "pids")
            _report_missing(sandbox, "memory")
    finally:
        await backend.close()
    assert after.status == "ok" and after.result == "2", after
    if kind == "local":
        assert threads == {"started": count, "error": None}, threads
        assert memory.status == "ok" and json.loads(memory.stdout)["got"] == size, memory
        return
    assert threads["started"] < LIMIT_PIDS and threads["error"], threads
    # A cgroup's OOM killer ends the kernel (restarted, with a notice); an address-space
    # rlimit fails the allocation.
    if memory.status == "ok":
        assert json.loads(memory.stdout.strip().splitlines()[-1])["got"] == "MemoryError", memory
    else:
        assert memory.status == "kernel_died" and memory.kernel_restarted, memory


COUNT_BODY: Final = r"""
print(json.dumps({'processes': sum(1 for p in os.listdir('/proc') if p.isdigit())}))
"""
POLL_S: Final = 0.2


async def _processes_settle(sandbox: Sandbox, want: int) -> int:
    """Count the processes in the sandbox's PID namespace until at most ``want`` are left (or
    a deadline passes); the last count."""
    deadline = asyncio.get_running_loop().time() + SETTLE_TIMEOUT_S
    while True:
        count = int((await run_json(sandbox, COUNT_BODY, cell_id="count"))["processes"])
        if count <= want or asyncio.get_running_loop().time() > deadline:
            return count
        await asyncio.sleep(POLL_S)


async def test_fork_bomb_and_memory_hog_stay_inside(
    bwrap_backend: SandboxBackend, tmp_path: Path
) -> None:
    sandbox = await bwrap_backend.create(_spec(tmp_path, "hostile", limits=SMALL_LIMITS))
    try:
        _report_missing(sandbox, "pids")
        _report_missing(sandbox, "memory")
        at_rest = (await run_json(sandbox, COUNT_BODY, cell_id="rest"))["processes"]

        hog = await sandbox.execute("x = b'a' * (1024**3)", timeout_s=CELL_TIMEOUT_S, cell_id="hog")
        assert hog.status in ("kernel_died", "error"), hog
        ok = await sandbox.execute("1 + 1", timeout_s=CELL_TIMEOUT_S, cell_id="after-hog")
        assert ok.status == "ok" and ok.result == "2", ok

        bomb = "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass\n"
        r = await sandbox.execute(bomb, timeout_s=BOMB_TIMEOUT_S, cell_id="bomb")
        assert r.status in ("timeout", "kernel_died") and r.notice, r
        # The host is fine: it still forks.
        assert subprocess.run(["true"], check=False).returncode == 0
        ok = await sandbox.execute("2 + 2", timeout_s=CELL_TIMEOUT_S, cell_id="after-bomb")
        assert ok.status == "ok" and ok.result == "4", ok

        assert await _processes_settle(sandbox, at_rest) <= at_rest
    finally:
        await sandbox.stop()


# --- the host's own layout ---------------------------------------------------------------------

PRIVATE_DIR_MODE: Final = 0o700


async def test_a_private_tmpdir_still_starts_a_sandbox(
    bwrap_backend: SandboxBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A root daemon whose TMPDIR is private (0700, as pam_tmpdir and `python -m bench` make
    it): the sandbox's runtime dir lies under it, and the sandbox's unprivileged user must not
    need to enter it. Found by bench/bench_bwrap.py under the bench runner."""
    # Short, like pam_tmpdir's /tmp/user/0: the sandbox's Unix sockets live below it.
    private = Path(tempfile.mkdtemp(prefix="pa-tmp-", dir="/tmp"))
    try:
        private.chmod(PRIVATE_DIR_MODE)
        monkeypatch.setenv("TMPDIR", str(private))
        monkeypatch.setattr(tempfile, "tempdir", str(private))
        sandbox = await bwrap_backend.create(_spec(tmp_path, "private-tmp"))
        try:
            r = await sandbox.execute("1 + 1", timeout_s=CELL_TIMEOUT_S, cell_id="a")
            assert r.status == "ok" and r.result == "2", r
        finally:
            await sandbox.stop()
        assert list(private.iterdir()) == []  # its runtime dir is gone with it
    finally:
        shutil.rmtree(private, ignore_errors=True)
