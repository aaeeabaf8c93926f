"""Per-request sampling parameters and their validation.

Validation raises EngineValidationError whose `.param` names the request
parameter at fault, so the API can answer a 400 with the right `param`. The
engine's names are the completions API's ("prompt", "max_tokens", "top_p",
"top_logprobs", ...); the API maps them to the client's where they differ
("messages" for a chat prompt).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from inference.engine.structured_spec import StructuredOutput

MAX_TOP_LOGPROBS = 20
MAX_STOP_STRINGS = 4
_SEED_MIN, _SEED_MAX = -(2**63), 2**64 - 1


class EngineValidationError(ValueError):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class PromptTooLongError(EngineValidationError):
    """The prompt and its completion do not fit this engine (its context length, or its KV cache)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, "prompt")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(slots=True)
class SamplingParams:
    max_tokens: int | None = 16  # None: up to the context length
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None  # None: off; 0: chosen token only; k: plus the top k
    skip_special_tokens: bool = True
    # a grammar every sampled token obeys (inference.engine.structured_spec; wire form: its to_dict())
    structured_output: StructuredOutput | None = None

    @classmethod
    def from_dict(cls, data: dict) -> "SamplingParams":
        """Build from a JSON dict (the queue's wire form); unknown keys are an error."""
        names = {f.name for f in fields(cls)}
        unknown = set(data) - names
        if unknown:
            bad = sorted(unknown)[0]
            raise EngineValidationError(f"Unknown sampling parameter {bad!r}", bad)
        params = cls(**data)
        if isinstance(params.stop, str):
            params.stop = [params.stop]
        elif params.stop is None:
            params.stop = []
        if params.stop_token_ids is None:
            params.stop_token_ids = []
        if params.structured_output is not None:
            from inference.engine.structured_spec import StructuredOutput

            params.structured_output = StructuredOutput.from_dict(params.structured_output)
        if params.logit_bias:
            try:
                params.logit_bias = {int(k): v for k, v in params.logit_bias.items()}
            except (TypeError, ValueError):
                raise EngineValidationError("logit_bias keys must be token ids", "logit_bias") from None
        return params

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["stop"] = list(self.stop)
        out["stop_token_ids"] = list(self.stop_token_ids)
        if self.logit_bias is not None:
            out["logit_bias"] = {str(k): v for k, v in self.logit_bias.items()}
        if self.structured_output is not None:
            out["structured_output"] = self.structured_output.to_dict()
        return out

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    def validate(self, vocab_size: int | None = None) -> "SamplingParams":
        """Raise EngineValidationError on the first invalid value; return self.

        With `vocab_size` (the API checks with the tokenizer's, the engine again with the model's),
        token ids must lie inside the vocabulary, and a `top_k` at or above it is set to 0: it
        keeps every token, which is what "no top-k filtering" means (as in vLLM)."""
        def fail(message: str, param: str):
            raise EngineValidationError(message, param)

        if self.max_tokens is not None and (not _is_int(self.max_tokens) or self.max_tokens < 1):
            fail(f"max_tokens must be a positive integer, got {self.max_tokens!r}", "max_tokens")
        if not _is_number(self.temperature) or not 0.0 <= self.temperature <= 2.0:
            fail(f"temperature must be between 0 and 2, got {self.temperature!r}", "temperature")
        if not _is_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            fail(f"top_p must be in (0, 1], got {self.top_p!r}", "top_p")
        if not _is_int(self.top_k) or self.top_k < -1:
            fail(f"top_k must be -1, 0 (off) or a positive integer, got {self.top_k!r}", "top_k")
        if vocab_size is not None and self.top_k >= vocab_size:
            self.top_k = 0
        if not _is_number(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            fail(f"min_p must be in [0, 1], got {self.min_p!r}", "min_p")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not -2.0 <= value <= 2.0:
                fail(f"{name} must be between -2 and 2, got {value!r}", name)
        if not _is_number(self.repetition_penalty) or not 0.0 < self.repetition_penalty <= 2.0:
            fail(f"repetition_penalty must be in (0, 2], got {self.repetition_penalty!r}", "repetition_penalty")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                fail("logit_bias must map token ids to biases", "logit_bias")
            for token, bias in self.logit_bias.items():
                if not _is_int(token) or token < 0 or (vocab_size is not None and token >= vocab_size):
                    fail(f"logit_bias has an invalid token id {token!r}", "logit_bias")
                if not _is_number(bias) or not -100.0 <= bias <= 100.0:
                    fail(f"logit_bias values must be between -100 and 100, got {bias!r}", "logit_bias")
        if self.seed is not None and (not _is_int(self.seed) or not _SEED_MIN <= self.seed <= _SEED_MAX):
            fail(f"seed must be a 64-bit integer, got {self.seed!r}", "seed")
        if not isinstance(self.stop, list) or len(self.stop) > MAX_STOP_STRINGS:
            fail(f"stop must be a list of at most {MAX_STOP_STRINGS} strings", "stop")
        if any(not isinstance(s, str) or not s for s in self.stop):
            fail("stop strings must be non-empty strings", "stop")
        if not isinstance(self.stop_token_ids, list) or any(
            not _is_int(t) or t < 0 or (vocab_size is not None and t >= vocab_size) for t in self.stop_token_ids
        ):
            fail("stop_token_ids must be valid token ids", "stop_token_ids")
        if not _is_int(self.min_tokens) or self.min_tokens < 0:
            fail(f"min_tokens must be a non-negative integer, got {self.min_tokens!r}", "min_tokens")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            fail("min_tokens must not exceed max_tokens", "min_tokens")
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS):
            fail(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {self.logprobs!r}", "top_logprobs")
        if not isinstance(self.ignore_eos, bool) or not isinstance(self.skip_special_tokens, bool):
            fail("ignore_eos and skip_special_tokens must be booleans", "ignore_eos")
        if self.structured_output is not None:
            from inference.engine.structured_spec import StructuredOutput

            self.structured_output = StructuredOutput.from_dict(self.structured_output).validate()
        return self
