"""The emulated cluster of the ``k8s_scale`` benchmark, in a process of its own so that the
benchmark's process is the orchestrator alone (its CPU time is the orchestrator's).

``python -m bench._k8s_cluster --capacity N``: kmock's emulator counting the requests that
arrive on the orchestrator's port (tests/k8s_counting.py) and a node that runs each pod's
gateway as a local process (tests/k8s_process_node.py). Prints one JSON line
``{"url": ..., "gateway_port": ...}`` once it serves; then answers each ``counts`` line on stdin
with one JSON line (the counts, the pods the node started, its failures). Ends at EOF, its
gateways stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Final

from tests.k8s_counting import counted_cluster
from tests.k8s_process_node import ProcessNode, free_gateway_port, running_process_node

NAMESPACE: Final = "prime-agent"
COUNTS_COMMAND: Final = "counts"


async def serve(capacity: int) -> None:
    async with counted_cluster() as cluster:
        node = ProcessNode(cluster.node_client(), NAMESPACE, capacity=capacity)
        async with running_process_node(node):
            port = free_gateway_port()
            print(json.dumps({"url": cluster.orchestrator_url, "gateway_port": port}), flush=True)
            while line := await asyncio.to_thread(sys.stdin.readline):
                if line.strip() == COUNTS_COMMAND:
                    report = {
                        **cluster.counts.snapshot(),
                        "started": node.started,
                        "failed": node.failed,
                    }
                    print(json.dumps(report), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench._k8s_cluster")
    parser.add_argument("--capacity", type=int, required=True, help="pods running at once")
    asyncio.run(serve(parser.parse_args().capacity))


if __name__ == "__main__":
    main()
