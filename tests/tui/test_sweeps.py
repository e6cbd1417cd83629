"""The sweep view against a real daemon: /sweeps lists a sweep with its progress, cost and
ETA; its cells are grouped by state; Enter on a cell that ran opens its session's chat."""

from __future__ import annotations

import os
from pathlib import Path

from tests.sweep_cells import cell_spec
from tests.tui.pilot import screen_text, until
from tui.app import PrimeAgentApp
from tui.chat import ChatScreen
from tui.sweeps import SweepScreen, SweepsScreen

SIZE = (140, 36)


async def test_the_sweep_view_shows_progress_and_opens_a_cells_chat(
    daemon: Path, project: Path
) -> None:
    app = PrimeAgentApp(daemon, cwd=project)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, ChatScreen))
        link = app.link
        created = await link.call("create_session", cwd=str(project), name="trial zero")
        sid = str(created["session"])
        # A runner that is this process (alive): two trials at once, one cell of three done
        # in 2 s, so two left take 2 s more (the ETA).
        await link.call(
            "sweep_open",
            name="demo",
            spec={"concurrency": {"trials": 2, "sandboxes": 2}},
            digest="d",
            runner_pid=os.getpid(),
        )
        await link.call("sweep_add_cells", name="demo", cells=[cell_spec(n) for n in range(3)])
        trial = await link.call("sweep_trial_start", name="demo", fingerprint="f2", session=sid)
        await link.call(
            "sweep_trial_finish",
            trial=trial["trial"],
            state="scored",
            score=1.0,
            answer="42",
            stop_reason="completed",
            wall_s=2.0,
        )

        await pilot.press(*"/sweeps", "enter")
        await until(pilot, lambda: isinstance(app.screen, SweepsScreen))
        await until(pilot, lambda: "demo" in screen_text(pilot))
        listing = screen_text(pilot)
        assert "1/3 done" in listing and "ETA 2s" in listing and "running" in listing

        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, SweepScreen))
        await until(pilot, lambda: "Scored (1)" in screen_text(pilot))
        cells = screen_text(pilot)
        assert "Pending (2)" in cells and "s-niah/2000/2" in cells and "score 1.00" in cells
        # The first pending cell is highlighted: it has no session yet.
        await pilot.press("enter")
        await until(pilot, lambda: "has not run yet" in screen_text(pilot))
        await pilot.press("down", "down", "enter")  # past the group header to the scored cell
        await until(
            pilot, lambda: isinstance(app.screen, ChatScreen) and app.screen.session_id == sid
        )
