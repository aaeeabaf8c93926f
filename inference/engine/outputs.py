"""What the engine hands back per step and request (`RequestOutput` with its `Usage` and `Timing`),
and `request_output`, which builds one from a sequence's state."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from inference.engine.sequence import Sequence, SeqStatus

FINISHED = SeqStatus.FINISHED


@dataclass(slots=True)
class Usage:
    prompt_tokens: int
    cached_tokens: int  # prompt tokens served from the prefix cache (billing trusts this)
    completion_tokens: int

    def to_dict(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "cached_tokens": self.cached_tokens,
                "completion_tokens": self.completion_tokens}


@dataclass(slots=True)
class Timing:
    queued_s: float | None  # arrival -> first scheduled
    ttft_s: float | None  # arrival -> first token
    e2e_s: float | None  # arrival -> finished (so far, while running)

    def to_dict(self) -> dict:
        return {"queued_s": self.queued_s, "ttft_s": self.ttft_s, "e2e_s": self.e2e_s}


@dataclass(slots=True)
class RequestOutput:
    """One step's news for one request.

    From `Engine.step()` the token, text and logprob fields are DELTAS (this step's
    tokens); from `Engine.generate()` they hold the whole completion.
    """

    request_id: str
    new_token_ids: list[int]
    delta_text: str
    logprobs: list[dict] | None
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | "error" | None
    usage: Usage
    timing: Timing
    stop_reason: str | int | None = None  # the matched stop string or stop token id
    prompt_token_ids: list[int] = field(default_factory=list)  # filled by generate() only
    error: str | None = None  # why, when finish_reason is "error" (the request failed inside the engine)

    def to_dict(self) -> dict:
        return {
            "request_id": self.request_id, "new_token_ids": list(self.new_token_ids),
            "delta_text": self.delta_text, "logprobs": self.logprobs, "finished": self.finished,
            "finish_reason": self.finish_reason, "usage": self.usage.to_dict(),
            "timing": self.timing.to_dict(), "stop_reason": self.stop_reason, "error": self.error,
        }


def request_output(seq: Sequence, tokens: list[int], text: str, logprobs, now: float | None = None) -> RequestOutput:
    """`seq`'s RequestOutput for this step: `tokens`, `text` and `logprobs` are the step's deltas."""
    arrival, end = seq.arrival_time, seq.finish_time
    if end is None:
        end = time.time() if now is None else now
    scheduled, first = seq.first_scheduled_time, seq.first_token_time
    # Built for every sequence every step: the three records by position (their fields' order), attributes
    # read directly (keyword arguments and property calls were half of this function's time).
    return RequestOutput(
        seq.request_id, tokens, text, logprobs, seq.status is FINISHED, seq.finish_reason,
        Usage(len(seq.prompt_token_ids), seq.cached_tokens, len(seq.output_token_ids)),
        Timing(None if scheduled is None else scheduled - arrival, None if first is None else first - arrival,
               end - arrival),
        seq.stop_reason,
    )
