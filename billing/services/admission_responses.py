"""What a client sees of admission: OpenAI's `x-ratelimit-*` headers, `Retry-After`, the refusal messages.

Pure functions (no Django). Durations are written as OpenAI writes them, in
Go's duration format: `12ms`, `1s`, `9.816s`, `6m0s`, `1h2m3s`.
"""

from __future__ import annotations

import math

from billing.counters.base import CONCURRENCY, QUOTA, REQUESTS, SPEND, TOKENS, BucketState, Refusal
from billing.counters.units import nanos_usd


def duration(seconds: float) -> str:
    """Go's time.Duration string at millisecond precision ("12ms", "1s", "6m0s", "1h0m0.5s")."""
    ms = max(0, round(seconds * 1000))
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest // 1000}.{rest % 1000:03d}".rstrip("0").rstrip(".")
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def ratelimit_headers(states: list[BucketState]) -> dict[str, str]:
    """`x-ratelimit-{limit,remaining,reset}-{requests,tokens}` of the binding bucket of each kind.

    With a tenant, a key and a per-model limit (its own counters, for the request's model) of the same
    kind, the one with the fewest units left is the one that will refuse first, so it is the one shown:
    as OpenAI's headers, they describe the limits of the request's model.
    """
    headers: dict[str, str] = {}
    for kind in (REQUESTS, TOKENS):
        mine = [state for state in states if state.kind == kind]
        if not mine:
            continue
        state = min(mine, key=lambda s: (s.remaining, -s.reset_s))
        headers[f"x-ratelimit-limit-{kind}"] = str(state.limit)
        headers[f"x-ratelimit-remaining-{kind}"] = str(state.remaining)
        headers[f"x-ratelimit-reset-{kind}"] = duration(state.reset_s)
    return headers


def retry_after_headers(seconds: float) -> dict[str, str]:
    """`Retry-After` in whole seconds (at least 1) and `retry-after-ms`, which the openai SDKs read first."""
    seconds = max(seconds, 0.001)
    return {"Retry-After": str(max(1, math.ceil(seconds))), "retry-after-ms": str(max(1, math.ceil(seconds * 1000)))}


_RATE_NAMES = {REQUESTS: "requests per min (RPM)", TOKENS: "tokens per min (TPM)"}


def rate_message(*, refusal: Refusal, model: str, scope_label: str) -> str:
    """OpenAI's wording: "... Limit 10000, Used 8554, Requested 3082. Please try again in 9.816s." """
    numbers = f"Limit {refusal.limit}, Used {refusal.used}, Requested {refusal.requested}."
    if refusal.kind == CONCURRENCY:
        return (f"Rate limit reached for {model} in {scope_label} on concurrent requests: {numbers} "
                f"Please try again when one of them finishes.")
    where = f"Rate limit reached for {model} in {scope_label} on {_RATE_NAMES[refusal.kind]}: {numbers}"
    if refusal.retry_after_s <= 0:
        return (f"Request too large for {model} in {scope_label} on {_RATE_NAMES[refusal.kind]}: {numbers} "
                f"Please reduce the prompt or max_tokens.")
    return f"{where} Please try again in {duration(refusal.retry_after_s)}."


def quota_message(*, refusal: Refusal, scope_label: str, period_label: str, period_end: str) -> str:
    if refusal.kind == QUOTA:
        what = (f"You exceeded the monthly token quota of {scope_label} for {period_label}: "
                f"Limit {refusal.limit}, Used {refusal.used}, Requested {refusal.requested} tokens "
                f"(prompt plus max_tokens).")
    elif refusal.kind == SPEND:
        what = (f"You exceeded the monthly budget of {scope_label} for {period_label}: "
                f"Limit ${nanos_usd(refusal.limit)}, Used ${nanos_usd(refusal.used)}, "
                f"Requested up to ${nanos_usd(refusal.requested)} (this request's worst case).")
    else:
        raise ValueError(refusal.kind)
    return f"{what} The period ends at {period_end}; lower max_tokens or ask an owner to raise the limit."

