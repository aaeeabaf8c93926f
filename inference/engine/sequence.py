"""One request's state inside the engine."""

from __future__ import annotations

import enum
import time

from inference.engine.sampling_params import SamplingParams


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """Prompt + generated tokens, KV blocks, progress, timing and stop state.

    `num_computed_tokens` counts tokens whose K/V are in the cache. Prefill and
    decode are not separate phases: each step computes the next
    `num_tokens - num_computed_tokens` tokens (or a chunk of them), and when a
    step reaches the end of the known tokens the sequence samples one more.
    """

    __slots__ = (
        "request_id", "prompt_token_ids", "output_token_ids", "token_ids", "sampling", "priority",
        "arrival_time", "cache_salt", "status", "num_computed_tokens", "block_table", "block_hashes",
        "num_registered_blocks", "cached_tokens", "admitted", "num_preemptions", "first_scheduled_time", "first_token_time",
        "finish_time", "finish_reason", "stop_reason", "generator", "max_tokens", "detok", "stopper",
        "counts", "order", "table_array", "table_array_of", "pending", "pending_row", "grammar",
        "spec_tokens", "spec_state",
    )

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: SamplingParams,
        *,
        max_tokens: int,
        priority: int = 0,
        cache_salt: str | None = None,
        arrival_time: float | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.output_token_ids: list[int] = []
        self.token_ids: list[int] = list(prompt_token_ids)  # prompt + output, appended in place
        self.sampling = sampling
        self.max_tokens = max_tokens
        self.priority = priority
        self.arrival_time = time.time() if arrival_time is None else arrival_time
        self.cache_salt = cache_salt or ""
        self.status = SeqStatus.WAITING
        self.num_computed_tokens = 0
        self.block_table: list[int] = []  # only ever appended to, or replaced by a new list (see table_array)
        self.table_array = None  # the model runner's int32 copy of block_table (array), kept in step by appends
        self.table_array_of = None  # the block_table list that table_array copies
        self.block_hashes: list[int] = []  # chain hashes of this sequence's full blocks, in order
        self.num_registered_blocks = 0  # leading blocks of block_table already offered to the prefix cache
        self.cached_tokens = 0  # prompt tokens served from the prefix cache at first admission
        self.admitted = False  # scheduled at least once (cached_tokens is fixed then)
        self.num_preemptions = 0
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.finish_time: float | None = None
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.generator = None  # torch.Generator for seeded sampling, set by the engine
        self.detok = None  # IncrementalDetokenizer
        self.stopper = None  # StopChecker
        self.counts = None  # sampler's per-sequence penalty state
        self.grammar = None  # structured output: its matcher (inference.engine.structured.GrammarState)
        self.order = 0  # insertion number, breaks ties between equal arrival times
        # async scheduling: tokens sampled on the device by launched steps and not yet appended (0-2), and
        # the row of the latest one in its step's sampled tokens (where the next step's input comes from)
        self.pending = 0
        self.pending_row = 0
        # speculative decoding: this step's draft tokens (computed after its last known token, verified when the
        # step's logits are sampled, never part of token_ids) and its acceptance history (engine.ngram_proposer)
        self.spec_tokens: list[int] = []
        self.spec_state = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is SeqStatus.FINISHED

    def samples_after(self, num_new_tokens: int) -> bool:
        """Whether a step computing `num_new_tokens` more of it reaches its end, so samples a token."""
        return self.num_computed_tokens + num_new_tokens == len(self.token_ids) + self.pending + len(self.spec_tokens)

    def append_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.token_ids.append(token_id)

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request_id!r}, {self.status.value}, prio={self.priority}, "
            f"tokens={self.num_tokens}, computed={self.num_computed_tokens}, blocks={len(self.block_table)})"
        )
