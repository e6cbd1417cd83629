"""Turning a ``CellResult`` into the text the model reads (docs/spec.md §2).

The sandbox has already bounded every stream and cleaned control characters; this module only
orders the parts, labels them and puts notices (timeout, kernel restart) first so the model
cannot miss them.
"""

from __future__ import annotations

from orchestrator.sandbox.base import CellResult

__all__ = ["NO_OUTPUT", "shape_cell_result"]

NO_OUTPUT = "(no output)"


def shape_cell_result(result: CellResult) -> str:
    parts: list[str] = []
    if result.notice:
        parts.append(f"[notice] {result.notice}")
    if result.stdout:
        parts.append(result.stdout.rstrip("\n"))
    if result.stderr:
        parts.append("[stderr]\n" + result.stderr.rstrip("\n"))
    if result.display:
        parts.append(result.display.rstrip("\n"))
    if result.result:
        parts.append("Out: " + result.result.rstrip("\n"))
    if result.error is not None:
        err = result.error
        body = err.traceback.rstrip("\n") or f"{err.ename}: {err.evalue}"
        parts.append(body)
    if result.status == "timeout" and not result.notice:
        parts.append("[notice] the cell timed out and was interrupted")
    if result.artifact_path is not None:
        size = f" ({result.artifact_bytes} bytes)" if result.artifact_bytes else ""
        parts.append(
            f"[output truncated: {result.truncated_chars} chars left out; "
            f"full output{size} in {result.artifact_path}]"
        )
    return "\n".join(parts) if parts else NO_OUTPUT
