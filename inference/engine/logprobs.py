"""OpenAI-shaped logprob entries from the sampler's raw numbers."""

from __future__ import annotations

from inference.engine.sampler import SampledLogprobs


class LogprobFormatter:
    """Caches each token's text and bytes; a token that is an incomplete piece of
    UTF-8 is spelled `bytes:\\xNN...` as OpenAI does."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def token(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is None:
            raw = self.tokenizer.token_bytes(token_id)
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            hit = self._cache[token_id] = (text, list(raw))
        return hit

    def entry(self, token_id: int, logprob: float) -> dict:
        text, raw = self.token(token_id)
        return {"token_id": token_id, "token": text, "logprob": logprob, "bytes": raw}

    def format(self, token_id: int, sampled: SampledLogprobs) -> dict:
        out = self.entry(token_id, sampled.logprob)
        out["top_logprobs"] = [self.entry(t, lp) for t, lp in sampled.top]
        return out
