"""N-gram prompt lookup: draft tokens for speculative decoding from the sequence's own tokens.

The proposer looks for the last `n` tokens of a sequence (its prompt and output so far) earlier in the
same sequence, for n from `max_n` down to `min_n`, and proposes the tokens that followed the most recent
earlier occurrence (Saxena's prompt lookup decoding; vLLM's `ngram` method). No second model: a
proposal costs a search, and it pays where the answer copies its prompt (summaries that quote, code
edits, rewrites).

The search runs in C: the token ids are packed as 4-byte integers and the n-gram is found with
`bytes.rfind`, a hit being kept only at a multiple of 4 (a token boundary).

`Speculator` decides, per step and per sequence, whether and how much to propose:
- per step: at most `max_rows` rows of decodes and drafts together (the running sequences count one each;
  a step that large is compute-bound, where verifying drafts costs as much as they save), and none for a
  sequence still in its prompt;
- per sequence: the proposal length follows its acceptance rate (an exponential moving average of the
  fraction of drafted tokens accepted), from `num_tokens` down to 1; a sequence whose drafts keep
  failing rests for a few steps between tries. Sequences whose rows are not position-independent
  (penalties, a grammar, min_tokens not yet reached, async scheduling) get no drafts.
"""

from __future__ import annotations

import math
from array import array

from inference.engine.sequence import Sequence

_EMA = 0.5  # weight of the newest step in a sequence's acceptance rate
_REST_BELOW = 0.15  # a sequence whose rate falls below this rests ...
_REST_STEPS = 4  # ... this many steps between drafts


def ngram_lookup(token_ids: list[int], *, min_n: int, max_n: int, k: int) -> list[int]:
    """Up to `k` tokens that followed the most recent earlier occurrence of the longest suffix n-gram
    (max_n >= n >= min_n) of `token_ids`; [] when none recurs."""
    num = len(token_ids)
    if k < 1 or num < min_n + 1:
        return []
    buf = array("i", token_ids).tobytes()
    for n in range(min(max_n, num - 1), min_n - 1, -1):
        pattern = buf[4 * (num - n):]
        end = 4 * (num - 1)  # the match must end before the last token (the suffix itself is excluded)
        pos = buf.rfind(pattern, 0, end)
        while pos >= 0 and pos % 4:
            pos = buf.rfind(pattern, 0, pos + len(pattern) - 1)
        if pos >= 0:
            start = pos // 4 + n
            return list(token_ids[start:start + k])
    return []


class SpecState:
    """One sequence's speculation history: its acceptance rate and its rest."""

    __slots__ = ("rate", "rest")

    def __init__(self) -> None:
        self.rate = 1.0  # optimistic: a new sequence drafts in full
        self.rest = 0


class Speculator:
    """Proposes draft tokens (n-gram prompt lookup) for the decoding sequences of a step."""

    def __init__(self, *, num_tokens: int, min_n: int = 2, max_n: int = 4, max_rows: int = 8) -> None:
        if num_tokens < 1 or not 1 <= min_n <= max_n or max_rows < 2:
            raise ValueError("speculation needs num_tokens >= 1, 1 <= min_n <= max_n and max_rows >= 2")
        self.num_tokens = num_tokens
        self.min_n, self.max_n = min_n, max_n
        self.max_rows = max_rows
        # what the steps drafted and kept (vLLM's spec_decode counters)
        self.counters = {"spec_decode_num_drafts": 0, "spec_decode_num_draft_tokens": 0,
                         "spec_decode_num_accepted_tokens": 0}

    def step_room(self, num_running: int) -> int:
        """How many drafts a step of `num_running` sequences may carry in all."""
        return self.max_rows - num_running

    def propose(self, seq: Sequence, budget: int) -> list[int]:
        """Drafts for `seq` (which decodes this step: one known token to compute), at most `budget` of them."""
        sp = seq.sampling
        if (sp.has_penalties or seq.grammar is not None or seq.pending
                or len(seq.output_token_ids) < sp.min_tokens):
            return []
        state = seq.spec_state
        if state is None:
            state = seq.spec_state = SpecState()
        if state.rest:
            state.rest -= 1
            return []
        # the drafts and the token after them must fit the request's max_tokens
        room = seq.max_tokens - len(seq.output_token_ids) - 1
        k = min(budget, room, max(1, math.ceil(self.num_tokens * state.rate)))
        if k < 1:
            return []
        return ngram_lookup(seq.token_ids, min_n=self.min_n, max_n=self.max_n, k=k)

    def record(self, seq: Sequence, drafted: int, accepted: int) -> None:
        """`seq` drafted `drafted` tokens this step and `accepted` of them were kept."""
        counters = self.counters
        counters["spec_decode_num_drafts"] += 1
        counters["spec_decode_num_draft_tokens"] += drafted
        counters["spec_decode_num_accepted_tokens"] += accepted
        state = seq.spec_state
        state.rate = (1 - _EMA) * state.rate + _EMA * (accepted / drafted)
        if state.rate < _REST_BELOW:
            state.rest = _REST_STEPS
            state.rate = _REST_BELOW  # after the rest it tries again, with short drafts
