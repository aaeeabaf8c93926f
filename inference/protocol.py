"""The worker↔web protocol: what a worker tells the web process about a request.

One request's events are `Delta`s, then exactly one `Done`. A worker sends
each reply channel at most one message per engine step: a `Batch` of every
event of that step for the jobs of that channel, in order. Reply channels are
per web process, not per request, so that is one channel-layer message per web
process per step whatever the number of streams; the web process routes each
event by its `request_id` (inference.api.replies).

Sequence numbers: a request's events are numbered 1, 2, ... in the order the
worker made them (`seq`; the `Done` carries the number after its last `Delta`;
0: not numbered, e.g. the reaper's error for a dead worker's request). The
worker keeps what it could not deliver and sends it again, in order, once the
channel layer is back (inference.worker.events); the web side drops a number
it already has and ends a stream whose next number never came with an error
instead of `[DONE]` over missing text (inference.api.job_run).

Both sides import this module and nothing of each other; the event type
strings live here only (a test checks that). On the channel layer a batch
travels as `Batch.encode()`, a dict of plain values (channels_redis packs it
with msgpack); `Batch.decode` reads it back. A reader in the worker's own
process (a `LocalReceiver`: the embedded worker's web process) is handed the
`Batch` itself, nothing encoded, by the sink it was given to
(inference.worker.events.LocalReceivers).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

logger = logging.getLogger(__name__)

DELTA = "engine.delta"
DONE = "engine.done"
BATCH = "engine.batch"

FinishReason = Literal["stop", "length", "abort", "error"]
TIMING_KEYS = ("queued_s", "ttft_s", "e2e_s", "engine_queued_s", "engine_ttft_s", "engine_e2e_s")


@dataclass(slots=True)
class Usage:
    """What a request is billed: prompt tokens (`cached_tokens` of them served from the prefix
    cache) and generated tokens."""

    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    # billing's frozen cost, {"currency": "usd", "input", "cached_input", "output", "total"} as
    # decimal strings; None when the worker could not price the request
    cost: dict[str, str] | None = None

    def encode(self) -> dict:
        data = {"prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "completion_tokens": self.completion_tokens}
        if self.cost is not None:
            data["cost"] = self.cost
        return data

    @classmethod
    def decode(cls, data: dict | None) -> Usage:
        data = data or {}
        return cls(int(data.get("prompt_tokens") or 0), int(data.get("cached_tokens") or 0),
                   int(data.get("completion_tokens") or 0), data.get("cost") or None)


@dataclass(slots=True)
class Timing:
    """The worker's clocks, seconds from the web process's enqueue: to the engine start, the first
    token, the end; the `engine_*` ones as the engine measured them from its own add_request."""

    queued_s: float | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    engine_queued_s: float | None = None
    engine_ttft_s: float | None = None
    engine_e2e_s: float | None = None

    def encode(self) -> dict[str, float | None]:
        return {key: getattr(self, key) for key in TIMING_KEYS}

    @classmethod
    def decode(cls, data: dict | None) -> Timing:
        data = data or {}
        return cls(*(data.get(key) for key in TIMING_KEYS))


@dataclass(slots=True)
class Delta:
    """Text and tokens one engine step generated for a request (`logprobs`: one entry per token, if asked).

    `system_fingerprint` (a request's first delta only; absent from older workers): what decides the
    engine's tokens, hashed (inference.engine.fingerprint); the API puts it on every response object."""

    request_id: str
    text: str
    token_ids: list[int]
    logprobs: list[dict] | None = None
    seq: int = 0  # this request's event number (module docstring); 0: not numbered
    system_fingerprint: str | None = None

    def encode(self) -> dict[str, Any]:
        data = {"type": DELTA, "request_id": self.request_id, "text": self.text, "token_ids": self.token_ids,
                "logprobs": self.logprobs, "seq": self.seq}
        if self.system_fingerprint is not None:
            data["system_fingerprint"] = self.system_fingerprint
        return data

    @classmethod
    def decode(cls, data: dict) -> Delta:
        return cls(data["request_id"], data.get("text") or "", list(data.get("token_ids") or ()), data.get("logprobs"),
                   int(data.get("seq") or 0), data.get("system_fingerprint"))


@dataclass(slots=True)
class Done:
    """The end of a request, sent once, after its usage record was written.

    `error` (finish_reason "error"): what went wrong; `error_param`: the request
    parameter at fault when the request itself was invalid, in the engine's
    names ("prompt", "top_p", ...; the API maps them to the client's).
    """

    request_id: str
    finish_reason: FinishReason
    usage: Usage = field(default_factory=Usage)
    timing: Timing = field(default_factory=Timing)
    error: str | None = None
    error_param: str | None = None
    seq: int = 0  # the number after the request's last Delta; 0: not numbered

    def encode(self) -> dict[str, Any]:
        data = {"type": DONE, "request_id": self.request_id, "finish_reason": self.finish_reason,
                "usage": self.usage.encode(), "timing": self.timing.encode(), "error": self.error, "seq": self.seq}
        if self.error_param is not None:
            data["error_param"] = self.error_param
        return data

    @classmethod
    def decode(cls, data: dict) -> Done:
        return cls(data["request_id"], data.get("finish_reason") or "error", Usage.decode(data.get("usage")),
                   Timing.decode(data.get("timing")), data.get("error"), data.get("error_param"), int(data.get("seq") or 0))


Event = Delta | Done
_DECODERS = {DELTA: Delta.decode, DONE: Done.decode}


@dataclass(slots=True)
class Batch:
    """The events of one step (or of several, when sending fell behind) for one reply channel, in order."""

    events: list[Event]

    def encode(self) -> dict[str, Any]:
        return {"type": BATCH, "events": [event.encode() for event in self.events]}

    @classmethod
    def decode(cls, message: dict) -> Batch:
        """The batch a channel-layer message carries; an event or message it does not know is
        dropped with a warning (a newer worker's, during a rolling upgrade)."""
        if message.get("type") != BATCH:
            logger.warning("not an event batch: %r", str(message)[:200])
            return cls([])
        events: list[Event] = []
        for data in message.get("events") or ():
            decode = _DECODERS.get(data.get("type")) if isinstance(data, dict) else None
            if decode is None:
                logger.warning("unknown event dropped: %r", str(data)[:200])
                continue
            events.append(decode(data))
        return cls(events)


# ---------------------------------------------------------------- in-process delivery
class LocalReceiver(Protocol):
    """A reply channel's reader in the worker's own process (inference.api.replies.ReplyChannel)."""

    loop: Any  # the asyncio event loop `deliver` must be called on

    def deliver(self, batch: Batch) -> None: ...
