"""The workspace works for the sandbox's user (issue 15, item 10), against a real Docker Engine.

- A project directory the container's user cannot enter (a root-owned ``mkdtemp``, 0700, as
  root: the container runs as the image's uid 1000) is one line naming ``--workspace copy``
  before any container starts, not an HTTP 500 from deep inside the gateway; the directory is
  not chmodded behind the user's back.
- ``--workspace copy`` works there: the private copy is the sandbox user's, the agent reads the
  project's 0600 file and writes a new one, and what lands back in the project belongs to the
  host user (root), never to the sandbox's uid.
- A non-root host user: the container runs as that user's uid:gid, its HOME is writable, and
  the file the agent writes in the user's own 0700 workspace belongs to the user. As root this
  runs the client as uid ``OTHER_UID`` with ``setpriv`` (supplementary group: the docker
  socket's group, as a member of the docker group would have), with an interpreter that user
  can run; as a non-root user it runs in this process.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from orchestrator.sandbox.base import SandboxSpec
from tests.helpers import need
from tests.integration.test_sandbox_conformance import docker_ready

ASYNC = pytest.mark.asyncio(loop_scope="module")
pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="linux only"),
    pytest.mark.timeout(600),
]

GRACE_S = 1.0
CELL_TIMEOUT_S = 60.0
OTHER_UID = 4321  # a non-root host user that exists nowhere (no passwd entry is needed)
DOCKER_SOCKET = Path("/var/run/docker.sock")
CLIENT_TIMEOUT_S = 300.0
REPO = Path(__file__).resolve().parents[2]

# What the non-root client runs: a sandbox in its own 0700 mkdtemp workspace; one JSON line.
NON_ROOT_CLIENT = """
import asyncio, json, os, tempfile
from pathlib import Path
from orchestrator.sandbox.base import SandboxSpec
from orchestrator.sandbox.docker import DockerBackend

CODE = (
    "import os, pathlib\\n"
    "open('agent.txt', 'w').write('mine')\\n"
    "pathlib.Path.home().joinpath('home.txt').write_text('home')\\n"
    "print(os.getuid(), os.getgid(), pathlib.Path.home().joinpath('home.txt').read_text())\\n"
)

async def main():
    ws = Path(tempfile.mkdtemp())
    backend = DockerBackend(pool_size=0)
    spec = SandboxSpec(session_id="wsu-nonroot", cwd=ws, artifacts_dir=Path(str(ws) + "-art"))
    sandbox = await backend.create(spec)
    try:
        result = await sandbox.execute(CODE, timeout_s=60, cell_id="c")
    finally:
        await sandbox.stop()
        await backend.close()
    st = (ws / "agent.txt").stat()
    print(json.dumps({
        "status": result.status, "stdout": result.stdout, "error": repr(result.error),
        "owner": [st.st_uid, st.st_gid], "me": [os.getuid(), os.getgid()],
        "ws_mode": oct(ws.stat().st_mode & 0o777),
    }))

asyncio.run(main())
"""


@pytest.fixture(scope="module")
def docker_image() -> None:
    why = docker_ready()
    if why is not None:
        need("docker", why)


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def backend(docker_image: None) -> AsyncIterator[Any]:
    from orchestrator.sandbox.docker import DockerBackend, list_owned

    b = DockerBackend(pool_size=0, interrupt_grace_s=GRACE_S)
    yield b
    await b.close()
    assert not [c for c in list_owned() if c.session_id.startswith("wsu-")]


def _private_project(tmp: Path) -> Path:
    """A ``mktemp -d`` project: 0700, owned by whoever runs the test, with a 0600 file."""
    project = Path(tempfile.mkdtemp(dir=tmp))
    assert stat.S_IMODE(project.stat().st_mode) == 0o700
    secret = project / "notes.txt"
    secret.write_text("only mine\n")
    secret.chmod(0o600)
    return project


@ASYNC
async def test_a_workspace_the_sandbox_user_cannot_enter_is_one_line(
    backend: Any, tmp_path: Path
) -> None:
    from orchestrator.errors import SandboxStartError
    from orchestrator.sandbox.docker import list_owned

    project = _private_project(tmp_path)
    spec = SandboxSpec(session_id="wsu-closed", cwd=project, artifacts_dir=tmp_path / "art")
    if os.getuid() != 0:  # the container runs as this user, who owns the directory: it works
        sandbox = await backend.create(spec)
        try:
            r = await sandbox.execute("open('notes.txt').read()", timeout_s=CELL_TIMEOUT_S)
            assert r.status == "ok" and "only mine" in r.result, r
        finally:
            await sandbox.stop()
        return
    with pytest.raises(SandboxStartError) as failed:
        await backend.create(spec)
    text = str(failed.value)
    assert "\n" not in text and "Traceback" not in text
    assert "--workspace copy" in text and str(project) in text and "uid 1000" in text, text
    assert stat.S_IMODE(project.stat().st_mode) == 0o700  # never chmodded behind our back
    assert not [c for c in list_owned() if c.session_id == "wsu-closed"]


@ASYNC
async def test_workspace_copy_works_where_the_sandbox_user_cannot_enter(
    backend: Any, tmp_path: Path
) -> None:
    project = _private_project(tmp_path)
    spec = SandboxSpec(
        session_id="wsu-copy", cwd=project, artifacts_dir=tmp_path / "art", workspace="copy"
    )
    sandbox = await backend.create(spec)
    try:
        code = (
            "import os\n"
            "print(open('notes.txt').read().strip(), os.getcwd())\n"
            "open('answer.txt', 'w').write('42\\n')\n"
            "open('notes.txt', 'a').write('and the agent\\n')\n"
        )
        r = await sandbox.execute(code, timeout_s=CELL_TIMEOUT_S, cell_id="copy")
        assert r.status == "ok", r
        assert r.stdout.strip() == f"only mine {project}"
    finally:
        await sandbox.stop()
    me = (os.getuid(), os.getgid())
    answer = project / "answer.txt"
    assert answer.read_text() == "42\n"
    assert (answer.stat().st_uid, answer.stat().st_gid) == me  # the host user's, not uid 1000
    notes = project / "notes.txt"
    assert notes.read_text() == "only mine\nand the agent\n"
    assert (notes.stat().st_uid, stat.S_IMODE(notes.stat().st_mode)) == (me[0], 0o600)
    assert stat.S_IMODE(project.stat().st_mode) == 0o700 and project.stat().st_uid == me[0]


def _interpreter_for(uid: int, gid: int, env: dict[str, str]) -> str | None:
    """An interpreter of this Python version that ``uid`` can run with our packages."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (sys.executable, f"/usr/bin/python{version}"):
        probe = subprocess.run(
            [*_as(uid, gid), candidate, "-c", "import orchestrator.sandbox.docker"],
            env=env,
            capture_output=True,
            timeout=CLIENT_TIMEOUT_S,
            check=False,
        )
        if probe.returncode == 0:
            return candidate
    return None


def _as(uid: int, gid: int) -> list[str]:
    groups = str(DOCKER_SOCKET.stat().st_gid)
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", f"--groups={groups}", "--"]


def test_a_non_root_user_runs_the_container_as_itself(
    docker_image: None, request: pytest.FixtureRequest
) -> None:
    if os.getuid() != 0:
        proc = subprocess.run(
            [sys.executable, "-c", NON_ROOT_CLIENT],
            capture_output=True,
            text=True,
            timeout=CLIENT_TIMEOUT_S,
            check=False,
        )
        expected = [os.getuid(), os.getgid()]
    else:
        if shutil.which("setpriv") is None:
            pytest.skip("setpriv is missing: cannot run the client as a non-root user")
        # Its home under the temp dir itself: pytest's tmp_path sits in root's 0700 directory.
        home = Path(tempfile.mkdtemp(prefix="prime-agent-test-user-"))
        request.addfinalizer(lambda: shutil.rmtree(home, ignore_errors=True))
        os.chown(home, OTHER_UID, OTHER_UID)
        site = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(home),
            "TMPDIR": str(home),
            "XDG_CONFIG_HOME": str(home / "config"),
            "XDG_DATA_HOME": str(home / "data"),
            "XDG_RUNTIME_DIR": str(home / "run"),
            "PYTHONPATH": os.pathsep.join([str(REPO), *sorted(site)]),
            "LANG": "C.UTF-8",
        }
        python = _interpreter_for(OTHER_UID, OTHER_UID, env)
        if python is None:
            pytest.skip(f"no Python {sys.version_info[:2]} that uid {OTHER_UID} can run")
        proc = subprocess.run(
            [*_as(OTHER_UID, OTHER_UID), python, "-c", NON_ROOT_CLIENT],
            env=env,
            capture_output=True,
            text=True,
            timeout=CLIENT_TIMEOUT_S,
            check=False,
        )
        expected = [OTHER_UID, OTHER_UID]
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["me"] == expected
    assert report["status"] == "ok", report
    # The container ran as the user (uid:gid), HOME worked, the file is the user's.
    assert report["stdout"].split() == [*map(str, expected), "home"]
    assert report["owner"] == expected and report["ws_mode"] == "0o700"
