"""Stop conditions of one request: stop strings, stop token ids, EOS, lengths.

Stop strings are matched on the detokenized text. Text that could be the
beginning of a stop string is held back until it is known not to be one, so a
stop string is never emitted, not even partly, and the concatenated deltas
equal the final text (which ends just before the stop string).
"""

from __future__ import annotations

from inference.engine.sampling_params import SamplingParams


class StopChecker:
    __slots__ = ("stops", "max_stop_len", "held", "eos_token_id", "stop_token_ids", "ignore_eos",
                 "min_tokens", "max_tokens", "max_len")

    def __init__(self, sampling: SamplingParams, *, eos_token_id: int | None, max_tokens: int,
                 max_model_len: int) -> None:
        self.stops = list(sampling.stop)
        self.max_stop_len = max((len(s) for s in self.stops), default=0)
        self.held = ""
        self.eos_token_id = eos_token_id
        self.stop_token_ids = frozenset(sampling.stop_token_ids)
        self.ignore_eos = sampling.ignore_eos
        self.min_tokens = sampling.min_tokens
        self.max_tokens = max_tokens
        self.max_len = max_model_len

    def check_token(self, token_id: int, num_output_tokens: int) -> tuple[str, int | None] | None:
        """Called with the count INCLUDING `token_id`. Returns ("stop", stop_reason) when the
        token ends the request (its text is then not emitted), else None."""
        if num_output_tokens <= self.min_tokens:  # the sampler masks these before min_tokens
            return None
        if token_id in self.stop_token_ids:
            return ("stop", token_id)
        if token_id == self.eos_token_id and not self.ignore_eos:
            return ("stop", None)
        return None

    def check_length(self, num_output_tokens: int, num_tokens: int) -> bool:
        return num_output_tokens >= self.max_tokens or num_tokens >= self.max_len

    def feed(self, text: str, num_output_tokens: int) -> tuple[str, str | None]:
        """Add newly decoded text; return (text safe to emit, matched stop string or None)."""
        if not self.stops:
            return text, None
        buf = self.held + text
        if num_output_tokens >= self.min_tokens:
            hit_at, hit = -1, None
            for stop in self.stops:
                at = buf.find(stop)
                if at != -1 and (hit_at == -1 or at < hit_at):
                    hit_at, hit = at, stop
            if hit is not None:
                self.held = ""
                return buf[:hit_at], hit
        keep = self._partial_suffix_len(buf)
        self.held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep], None

    def _partial_suffix_len(self, buf: str) -> int:
        """Length of the longest suffix of `buf` that is a proper prefix of some stop string."""
        for n in range(min(len(buf), self.max_stop_len - 1), 0, -1):
            tail = buf[-n:]
            if any(stop.startswith(tail) for stop in self.stops):
                return n
        return 0

    def flush(self) -> str:
        """The request ends for another reason: held text was not a stop string after all."""
        out, self.held = self.held, ""
        return out
