"""Iteration-level continuous batching with chunked prefill, priorities and preemption.

Every step gets a budget of `max_num_batched_tokens`. Running sequences are
served first, best-ranked first: a decoding sequence takes one token, one
still in prefill takes a chunk of what is left of the budget. Then waiting
sequences are admitted in rank order, each starting after its prefix-cache
hit, while the budget, the running-sequence cap and the KV blocks allow.

Background requests (priority at or past `background_priority`: the Batch API's lines) sit out every step
that prefills a foreground request: a new request's first token never waits behind them.

When a running sequence cannot get a block, the worst-ranked running sequence
is preempted by recompute: its blocks are released (full ones stay in the
prefix cache, so re-admission usually hits them) and it returns to the
waiting queue keeping its generated tokens. A waiting sequence that strictly
outranks the worst running one may preempt it to get a seat or blocks.

With speculative decoding (`speculator`: inference.engine.ngram_proposer) a decoding sequence may take its
draft tokens too (`Sequence.spec_tokens`): one known token and k drafts, verified when the step's logits are
sampled; the blocks for all of them are allocated now, and those of rejected drafts are written again by the
next step (the step order rolls `num_computed_tokens` back to the accepted ones).

With a model whose every layer is windowed, a running sequence gives back the
blocks behind its window before it grows (BlockManager.release_outside_window),
so a long sequence holds about window / block_size + 2 blocks and the blocks it
asks for are only those past its table's end.
"""

from __future__ import annotations

import bisect
import itertools
import time
from dataclasses import dataclass, field

from inference.engine.block_manager import BlockManager
from inference.engine.scheduler_policy import PriorityPolicy
from inference.engine.sequence import Sequence, SeqStatus


@dataclass(slots=True)
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def __bool__(self) -> bool:
        return bool(self.seqs)

    def notify_first_tokens(self, callback) -> None:
        """Call `callback` with the ids of the requests whose first token this step samples."""
        firsts = [seq.request_id for seq, n in zip(self.seqs, self.num_new_tokens)
                  if not seq.output_token_ids and not seq.pending and seq.samples_after(n)]
        if firsts:
            callback(firsts)

    def _add(self, seq: Sequence, n: int) -> None:
        self.seqs.append(seq)
        self.num_new_tokens.append(n)

    def _remove(self, seq: Sequence) -> int:
        i = self.seqs.index(seq)
        del self.seqs[i]
        return self.num_new_tokens.pop(i)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        policy: PriorityPolicy,
        background_priority: int | None = None,
        speculator=None,
    ) -> None:
        self.bm = block_manager
        self.speculator = speculator  # drafts for decoding sequences (inference.engine.ngram_proposer.Speculator)
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.policy = policy
        self.background_priority = background_priority
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []  # kept sorted best-first during schedule()
        self.requests: dict[str, Sequence] = {}
        self.num_preemptions = 0
        self._counter = itertools.count()

    # ---- request lifecycle ------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        if seq.request_id in self.requests:
            raise ValueError(f"duplicate request id {seq.request_id!r}")
        seq.order = next(self._counter)
        seq.status = SeqStatus.WAITING
        self.requests[seq.request_id] = seq
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def finish(self, seq: Sequence, reason: str) -> None:
        """Retire a sequence (stop, length or abort) and free its blocks at once."""
        if self.requests.pop(seq.request_id, None) is None:
            return
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
        else:
            self.waiting.remove(seq)
        self.bm.free(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
        seq.finish_time = time.time()

    def abort(self, request_id: str) -> Sequence | None:
        seq = self.requests.get(request_id)
        if seq is not None:
            self.finish(seq, "abort")
        return seq

    # ---- one step ---------------------------------------------------------------------------
    def schedule(self, now: float | None = None) -> ScheduledBatch:
        now = time.time() if now is None else now
        key = self.policy.sort_key(now)
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        running = self.running
        running.sort(key=key)

        # Every running sequence passes here every step: attributes are read directly.
        allocate = self.bm.allocate
        release = self.bm.release_outside_window if self.bm.window else None
        add_seq, add_n = batch.seqs.append, batch.num_new_tokens.append
        spec = self.speculator
        room = 0 if spec is None else spec.step_room(len(running))
        if room <= 0:
            spec = None  # a large batch is compute-bound: drafts would cost what they save
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            i += 1
            pending = seq.pending  # async scheduling: tokens sampled by steps in flight, not yet appended
            if pending and len(seq.output_token_ids) + pending >= seq.max_tokens:
                continue  # its pending token is its last (max_tokens): a step scheduled ahead would be wasted
            computed = seq.num_computed_tokens
            n = len(seq.token_ids) + pending - computed  # a pending token is its next input
            if n > budget:
                n = budget
            if spec is not None and n == 1:
                drafts = seq.spec_tokens = spec.propose(seq, min(budget - 1, room))
                n += len(drafts)
                room -= len(drafts)
                if room <= 0:
                    spec = None
            if release is not None:
                release(seq)
            if not allocate(seq, n) and not self._preempt_until_allocated(seq, n, batch):
                break  # `seq` itself was the worst and got preempted
            add_seq(seq)
            add_n(n)
            budget -= n

        if not batch.preempted:  # memory is tight when anyone was preempted: admit nobody new
            self.waiting.sort(key=key)
            while self.waiting and budget > 0 and self.waiting[0] not in batch.preempted:
                n = self._admit(self.waiting[0], budget, now, key, batch)
                if n == 0:
                    break  # head-of-line: a lower-ranked request does not jump the queue
                budget -= n
        if self.background_priority is not None:
            self._background_sits_out(batch)
        return batch

    def _background_sits_out(self, batch: ScheduledBatch) -> None:
        """A step that prefills a foreground request leaves the background rows out: they keep their seats and
        blocks and go on at the next step, and the request's first token does not wait behind work sold as
        spare capacity (the Batch API's lines). A decode-only step runs them all."""
        background = self.background_priority
        seqs, counts = batch.seqs, batch.num_new_tokens
        if not any(n - len(seq.spec_tokens) > 1 and seq.priority < background for seq, n in zip(seqs, counts)):
            return
        kept = [(seq, n) for seq, n in zip(seqs, counts) if seq.priority < background]
        for seq in seqs:
            if seq.priority >= background:
                seq.spec_tokens = []
        if len(kept) < len(seqs):
            seqs[:] = [seq for seq, _ in kept]
            counts[:] = [n for _, n in kept]

    def _preempt_until_allocated(self, seq: Sequence, n: int, batch: ScheduledBatch) -> bool:
        """`seq` could not get blocks for `n` more tokens: preempt the worst running sequence until it can.
        False when `seq` itself was the worst."""
        while True:
            victim = self.running[-1]
            self._preempt(victim, batch)
            if victim is seq:
                return False
            if self.bm.allocate(seq, n):
                return True

    def _admit(self, seq: Sequence, budget: int, now: float, key, batch: ScheduledBatch) -> int:
        """Admit the best waiting sequence; return the tokens scheduled for it (0: not admitted)."""
        while len(self.running) >= self.max_num_seqs:
            if not self._preempt_worse(seq, now, batch):
                return 0
            budget = self.max_num_batched_tokens - batch.num_tokens
        prefix = self.bm.match_prefix(seq)
        cached = len(prefix) * self.bm.block_size
        n = min(seq.num_tokens - cached, budget)
        while not self.bm.can_allocate(seq, n, prefix):
            if not self._preempt_worse(seq, now, batch):
                return 0
            budget = self.max_num_batched_tokens - batch.num_tokens
            n = min(seq.num_tokens - cached, budget)
        self.bm.allocate(seq, n, prefix)
        seq.num_computed_tokens = cached
        if not seq.admitted:  # billing counts the first admission's hit only
            seq.admitted = True
            seq.cached_tokens = min(cached, seq.num_prompt_tokens)
            seq.first_scheduled_time = now
            self.bm.record_query(query_tokens=seq.num_prompt_tokens, hit_tokens=seq.cached_tokens)
        self.waiting.pop(0)
        seq.status = SeqStatus.RUNNING
        bisect.insort(self.running, seq, key=key)
        batch._add(seq, n)
        return n

    def _preempt_worse(self, seq: Sequence, now: float, batch: ScheduledBatch) -> bool:
        if not self.running or not self.policy.outranks(seq, self.running[-1], now):
            return False
        self._preempt(self.running[-1], batch)
        return True

    def _preempt(self, victim: Sequence, batch: ScheduledBatch) -> None:
        if victim in batch.seqs:
            batch._remove(victim)
        self.running.remove(victim)
        self.bm.free(victim)
        victim.num_computed_tokens = 0
        victim.spec_tokens = []
        victim.num_preemptions += 1
        victim.status = SeqStatus.WAITING
        self.waiting.append(victim)
        batch.preempted.append(victim)
        self.num_preemptions += 1

    def postprocess(self, batch: ScheduledBatch) -> None:
        """After the model ran (or was launched): the scheduled tokens are in the KV cache now. Blocks
        holding a pending token are registered in the prefix cache once the token is known."""
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            seq.num_computed_tokens += n
            self.bm.cache_full_blocks(seq)
