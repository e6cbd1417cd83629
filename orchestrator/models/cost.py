"""Cost of one model call: configured prices first, then litellm's bundled map, else unknown.

Unknown is ``None``, never 0: a self-hosted or unmapped model must not look free.
"""

from __future__ import annotations

from orchestrator.models.registry import Prices, ResolvedModel

__all__ = ["call_cost", "lookup_prices"]


def lookup_prices(model: ResolvedModel) -> Prices | None:
    if model.prices is not None:
        return model.prices
    from orchestrator.models.lite import load_litellm

    table = load_litellm().model_cost
    entry = table.get(model.litellm_model) or table.get(model.name)
    if not isinstance(entry, dict):
        return None
    inp, out = entry.get("input_cost_per_token"), entry.get("output_cost_per_token")
    if not isinstance(inp, int | float) or not isinstance(out, int | float):
        return None
    read = entry.get("cache_read_input_token_cost")
    write = entry.get("cache_creation_input_token_cost")
    return Prices(
        input=float(inp),
        output=float(out),
        cache_read=float(read) if isinstance(read, int | float) else None,
        cache_write=float(write) if isinstance(write, int | float) else None,
    )


def call_cost(
    model: ResolvedModel, *, input: int, output: int, cache_read: int, cache_write: int
) -> float | None:
    prices = lookup_prices(model)
    if prices is None:
        return None
    # Cached tokens are billed at their own rate when the model has one, else as input.
    read_rate = prices.cache_read if prices.cache_read is not None else prices.input
    write_rate = prices.cache_write if prices.cache_write is not None else prices.input
    return (
        input * prices.input
        + output * prices.output
        + cache_read * read_rate
        + cache_write * write_rate
    )
