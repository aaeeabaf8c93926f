"""A step's sampling when some of its sequences carry draft tokens (speculative decoding).

The rows of sequences without drafts are sampled as in any step (`Sampler.launch`/`finish`: the same
tokens, the same uniforms); the rows of drafting sequences are verified (`SpecVerifier`), each such sequence
taking its kept drafts and one token more in one run (`TokenOutputs.take_run`). A drafting sequence that
goes on has its `num_computed_tokens` rolled back to its kept tokens: the K/V of refused drafts stay in its
blocks, unregistered, and the next step writes over them. Its acceptance is recorded (`Speculator.record`:
the next proposal's length and the spec_decode counters).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inference.engine.block_manager import BlockManager
from inference.engine.ngram_proposer import Speculator
from inference.engine.outputs import RequestOutput
from inference.engine.sampler import PendingSample, Sampler, SamplerOutput
from inference.engine.scheduler import ScheduledBatch
from inference.engine.sequence import Sequence, SeqStatus
from inference.engine.spec_verify import SpecVerifier, Verified
from inference.engine.token_outputs import TokenOutputs

FINISHED = SeqStatus.FINISHED


@dataclass(slots=True)
class SpecPending:
    plain: PendingSample | None  # the rows of sequences without drafts, sampled as usual ...
    verified: list[Verified]
    sampled: SamplerOutput | None = None  # ... and read back (`SpecSampling.finish`)


def drafting(batch: ScheduledBatch) -> bool:
    return any(seq.spec_tokens for seq in batch.seqs)


def drop_drafts(batch: ScheduledBatch) -> None:
    """Take the drafts out of `batch` (a step that failed is rerun without them)."""
    counts = batch.num_new_tokens
    for i, seq in enumerate(batch.seqs):
        if seq.spec_tokens:
            counts[i] -= len(seq.spec_tokens)
            seq.spec_tokens = []


class SpecSampling:
    """Samples and takes a drafting step's tokens: `sampler` for plain rows, a verifier for drafting ones,
    `tokens` takes them, `speculator` learns each sequence's acceptance, `block_manager` registers the blocks
    its kept tokens fill."""

    def __init__(self, *, sampler: Sampler, speculator: Speculator, tokens: TokenOutputs,
                 block_manager: BlockManager) -> None:
        self.sampler = sampler
        self.verifier = SpecVerifier(sampler)
        self.speculator = speculator
        self.tokens = tokens
        self.block_manager = block_manager

    def launch(self, logits: torch.Tensor, seqs: list[Sequence]) -> SpecPending:
        """`seqs`: one per logits row (a drafting sequence once per row, its rows consecutive)."""
        dev = logits.device
        plain = [i for i, seq in enumerate(seqs) if not seq.spec_tokens]
        spec = [i for i, seq in enumerate(seqs) if seq.spec_tokens]
        pending = None
        if plain:
            rows = logits if len(plain) == len(seqs) else logits[torch.tensor(plain, device=dev)]
            pending = self.sampler.launch(rows, [seqs[i] for i in plain])
        verified = []
        if spec:
            rows = logits if len(spec) == len(seqs) else logits[torch.tensor(spec, device=dev)]
            verified = self.verifier.verify(rows, [seqs[i] for i in spec])
        return SpecPending(pending, verified)

    def finish(self, pending: SpecPending) -> SpecPending:
        """Read the plain rows' tokens back (the drafting rows were verified on the host already)."""
        if pending.plain is not None:
            pending.sampled = self.sampler.finish(pending.plain)
        return pending

    def take(self, pending: SpecPending, now: float, outputs: list[RequestOutput]) -> tuple[list, int]:
        """Take the step's tokens -> (taken tokens and runs, for `TokenOutputs.emit_all`; tokens taken)."""
        taken: list = []
        sampled = pending.sampled
        if sampled is not None:
            taken = self.tokens.take_all(pending.plain.seqs, sampled.token_ids, sampled.logprobs, now, outputs)
        num = len(taken)
        for verified in pending.verified:
            seq = verified.seq
            seq.spec_tokens = []
            if seq.status is FINISHED:  # aborted (async_output: a late stop string) since it was scheduled
                continue
            self.speculator.record(seq, verified.drafted, verified.accepted)
            try:
                run = self.tokens.take_run(seq, verified.token_ids, verified.logprobs, now)
            except Exception as exc:  # noqa: BLE001 - this sequence's own failure ends it alone
                outputs.append(self.tokens.fail(seq, exc))
                continue
            if seq.status is not FINISHED:
                seq.num_computed_tokens = len(seq.token_ids) - 1  # refused drafts' K/V are written over next step
                self.block_manager.cache_full_blocks(seq)
            taken.append(run)
            num += len(run)
        return taken, num
