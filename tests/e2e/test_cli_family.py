"""A family run from the command line: print mode waits for the children; agents and
usage --tree show the tree with own and total usage."""

from __future__ import annotations

import json

from orchestrator.testing import FakeModelServer
from tests.helpers import cli
from tests.integration.test_family import THREE_CHILDREN


def test_family_run_then_agents_and_usage_tree() -> None:
    with FakeModelServer(THREE_CHILDREN) as srv:
        proc = cli(["-p", "spawn three", "--model", "openai/fake", "--api-base", srv.url])
        requests = len(srv.requests)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "noted\n"  # printed only after every child's reply was handled

    listing = cli(["agents", "--json"])
    assert listing.returncode == 0, listing.stderr
    (root,) = json.loads(listing.stdout)
    assert root["name"] == "spawn three" and root["status"] == "completed"
    kids = root["children"]
    assert sorted(k["name"] for k in kids) == ["a", "b", "c"]
    assert all(k["depth"] == 1 and k["rlm_child_id"].startswith("sub-") for k in kids)
    assert root["total"]["calls"] == requests
    assert root["total"]["input"] == root["own"]["input"] + sum(k["total"]["input"] for k in kids)

    tree = cli(["usage", "--tree", root["session_id"]])
    assert tree.returncode == 0, tree.stderr
    rows = tree.stdout.splitlines()
    assert rows[1].startswith("spawn three")
    assert sum(r.lstrip("│ ").startswith(("├─", "└─")) for r in rows) == 3
