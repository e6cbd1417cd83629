"""Cost of one model call: configured prices first, then litellm's bundled map, else unknown.

Unknown is ``None``, never 0: a self-hosted or unmapped model must not look free. The map is
read by price_map.py (no litellm import), and a model's prices are looked up once.
"""

from __future__ import annotations

import functools

from orchestrator.call_records import UsagePayload
from orchestrator.models.price_map import model_entry
from orchestrator.models.registry import Prices, ResolvedModel

__all__ = ["call_cost", "lookup_prices", "usage_record"]


def _rate(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


@functools.cache
def _mapped_prices(litellm_model: str, name: str) -> Prices | None:
    entry = model_entry(litellm_model, name)
    if entry is None:
        return None
    inp, out = _rate(entry.get("input_cost_per_token")), _rate(entry.get("output_cost_per_token"))
    if inp is None or out is None:
        return None
    return Prices(
        input=inp,
        output=out,
        cache_read=_rate(entry.get("cache_read_input_token_cost")),
        cache_write=_rate(entry.get("cache_creation_input_token_cost")),
    )


def lookup_prices(model: ResolvedModel) -> Prices | None:
    if model.prices is not None:
        return model.prices
    return _mapped_prices(model.litellm_model, model.name)


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


def usage_record(
    model: ResolvedModel, *, prompt: int, output: int, cache_read: int, cache_write: int
) -> UsagePayload:
    """The ``usage`` event of one call from the provider's counts (``prompt`` includes the
    cached tokens; the record splits them out and prices each part)."""
    uncached = max(0, prompt - cache_read - cache_write)
    return UsagePayload(
        provider=model.provider,
        model=model.name,
        input=uncached,
        output=output,
        cache_read=cache_read,
        cache_write=cache_write,
        cost_usd=call_cost(
            model, input=uncached, output=output, cache_read=cache_read, cache_write=cache_write
        ),
    )
