"""One run of a peer agent against the scripted model, run by the peers' venv (bench/peers.py).

``python bench/_peer_agent.py PEER API_BASE`` with PEER ``smolagents`` or ``rlms``: builds the
peer's code agent on the OpenAI-compatible ``API_BASE`` and runs one task to its final answer,
then prints one JSON line: ``{"step_ends": [monotonic seconds, ...], "answer": ...}``, one
timestamp per finished step (model call + code run), taken by the peer's own step hook.

It imports nothing from this project (the peers' venv does not have it) and uses the standard
library besides the peer. The scripted model decides how many steps the run takes.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

FAKE_KEY = "sk-fake"
FAKE_MODEL = "fake"
MAX_STEPS = 200
TASK = "peer bench task"


def _smolagents(api_base: str) -> tuple[list[float], Any]:
    from smolagents import CodeAgent, OpenAIServerModel

    ends: list[float] = []
    model = OpenAIServerModel(model_id=FAKE_MODEL, api_base=api_base, api_key=FAKE_KEY)
    agent = CodeAgent(
        tools=[],
        model=model,
        max_steps=MAX_STEPS,
        verbosity_level=0,
        step_callbacks=[lambda *_a, **_k: ends.append(time.monotonic())],
    )
    return ends, agent.run(TASK)


def _rlms(api_base: str) -> tuple[list[float], Any]:
    from rlm import RLM

    ends: list[float] = []
    agent = RLM(
        backend="openai",
        backend_kwargs={"model_name": FAKE_MODEL, "base_url": api_base, "api_key": FAKE_KEY},
        max_iterations=MAX_STEPS,
    )
    # rlms 0.1.3 stores ``on_iteration_complete`` but never calls it: time its one iteration
    # method (model call, then the reply's code blocks) instead.
    turn = agent._completion_turn

    def timed_turn(*args: Any, **kwargs: Any) -> Any:
        try:
            return turn(*args, **kwargs)
        finally:
            ends.append(time.monotonic())

    agent._completion_turn = timed_turn  # type: ignore[method-assign]
    return ends, agent.completion(TASK).response


def main(argv: list[str]) -> int:
    peer, api_base = argv[1], argv[2]
    run = {"smolagents": _smolagents, "rlms": _rlms}[peer]
    ends, answer = run(api_base)
    print(json.dumps({"step_ends": ends, "answer": str(answer)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
