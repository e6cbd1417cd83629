"""The scripted fake model server as a program, plus one line per chat request in a timings file:
the milliseconds the server spent on that request (request line parsed → last byte of the reply
written).

``python -m bench._timed_fake --timings FILE [fake_model options...]``

The fake server keeps no per-request timing of its own, so this wraps its request handler's
``do_POST`` (a private class of ``orchestrator.testing.fake_model``; the bench may reach into it,
the product never does). Everything else is ``fake_model.main`` unchanged.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Any

from orchestrator.testing import fake_model

CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")


def main() -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--timings", required=True)
    args, rest = parser.parse_known_args()
    lock = threading.Lock()
    out = open(args.timings, "a")  # noqa: SIM115 - open for the life of the process
    handler: Any = fake_model._Handler
    original = handler.do_POST

    def timed_post(self: Any) -> None:
        start = time.perf_counter()
        try:
            original(self)
        finally:
            if self.path.split("?", 1)[0].rstrip("/") in CHAT_PATHS:
                elapsed_ms = (time.perf_counter() - start) * 1000.0
                with lock:
                    out.write(f"{elapsed_ms:.3f}\n")
                    out.flush()

    handler.do_POST = timed_post
    return fake_model.main(rest)


if __name__ == "__main__":
    sys.exit(main())
