"""Verifying draft tokens: the tokens a speculative sequence emits from one step's logits.

A speculative sequence computed its last known token and its k drafts d_1..d_k in one forward; row j of
its logits is the model's distribution for the token after d_j (row 0: after its last known token).

- Greedy: the drafts are kept while each equals its row's argmax; the first row whose argmax differs gives
  the correction, and when all k are kept row k gives one more (the bonus). The tokens are exactly those
  that k + 1 plain greedy steps would have produced.
- Sampled: speculative sampling (Leviathan et al. 2023, Chen et al. 2023) with a draft that is a point mass
  (the n-gram proposes one token per place, q(d_j) = 1): d_j is kept with probability p_j(d_j); at the first
  refusal one token is drawn from p_j with d_j removed (the residual max(0, p - q), renormalized); when all
  are kept the bonus is drawn from p_k. Each emitted token then has exactly the distribution plain sampling
  gives it. p is the distribution plain sampling draws from (temperature, top-k, top-p, min-p, logit_bias:
  `Sampler.probs`); rows with penalties, a grammar or a min_tokens ban get no drafts (their processing
  depends on the tokens before them). The uniforms come from the request's own generator when it has a seed.
- Logprobs, when asked, are those of each emitted token's own row (the raw model distribution).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inference.engine.sampler import SampledLogprobs, Sampler, _gather_logprobs, inverse_cdf_draw
from inference.engine.sequence import Sequence
from kernels.fused_ops_cpu import argmax_cpu


@dataclass(slots=True)
class Verified:
    seq: Sequence
    token_ids: list[int]  # the kept drafts and one token more (the correction or the bonus)
    logprobs: list[SampledLogprobs] | None
    drafted: int
    accepted: int


def row_groups(seqs: list[Sequence]) -> list[tuple[Sequence, int, int]]:
    """(seq, first row, rows) of each sequence in the per-row list `seqs` (a sequence's rows are consecutive)."""
    groups = []
    i, n = 0, len(seqs)
    while i < n:
        seq = seqs[i]
        j = i + 1
        while j < n and seqs[j] is seq:
            j += 1
        groups.append((seq, i, j - i))
        i = j
    return groups


class SpecVerifier:
    """Turns the logits of speculative sequences' rows into their emitted tokens, sampling with `sampler`."""

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler

    @torch.inference_mode()
    def verify(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[Verified]:
        """`logits` [R, V], one row per entry of `seqs`: each speculative sequence's 1 + k rows, in order."""
        logits = logits.float()
        groups = row_groups(seqs)
        lp_rows = [i for i, s in enumerate(seqs) if s.sampling.logprobs is not None]
        raw_lp = None
        if lp_rows:
            raw_lp = torch.log_softmax(logits[torch.tensor(lp_rows, device=logits.device)], dim=-1)
        sampler = self.sampler
        sampler.process(logits, seqs)  # logit_bias (the only processing a drafting row can have)
        greedy_rows = [i for i, s in enumerate(seqs) if s.sampling.greedy]
        argmax = {}
        if greedy_rows:
            picked = argmax_cpu(logits if len(greedy_rows) == len(seqs)
                                else logits[torch.tensor(greedy_rows, device=logits.device)])
            argmax = dict(zip(greedy_rows, picked.tolist()))
        out = []
        for seq, first, rows in groups:
            drafts = seq.spec_tokens[:rows - 1]
            if seq.sampling.greedy:
                tokens = _greedy_run(drafts, [argmax[first + j] for j in range(rows)])
            else:
                tokens = self._sampled_run(logits[first:first + rows], seq, drafts)
            out.append(Verified(seq, tokens, None, len(drafts), len(tokens) - 1))
        if raw_lp is not None:
            _attach_logprobs(out, groups, raw_lp, lp_rows, sampler.per_row)
        return out

    def _sampled_run(self, logits: torch.Tensor, seq: Sequence, drafts: list[int]) -> list[int]:
        """Speculative sampling over one sequence's rows (see the module's docstring)."""
        sampler = self.sampler
        rows = logits.shape[0]
        if sampler.per_row:
            probs = torch.cat([sampler.probs(logits[j:j + 1], [seq]) for j in range(rows)])
        else:
            probs = sampler.probs(logits, [seq] * rows)
        dev = probs.device
        keep = probs[torch.arange(len(drafts), device=dev), torch.tensor(drafts, device=dev)].tolist() if drafts else []
        tokens = []
        for j, draft in enumerate(drafts):
            if float(sampler.uniforms([seq])[0]) < keep[j]:
                tokens.append(draft)
                continue
            residual = probs[j].clone()
            residual[draft] = 0.0
            if not float(residual.sum()) > 0.0:  # p put all its mass on the draft (a refusal has probability 0)
                tokens.append(draft)
                continue
            tokens.append(int(inverse_cdf_draw(residual[None], sampler.uniforms([seq]).to(dev))[0]))
            return tokens
        tokens.append(int(inverse_cdf_draw(probs[rows - 1:rows], sampler.uniforms([seq]).to(dev))[0]))
        return tokens


def _greedy_run(drafts: list[int], argmax: list[int]) -> list[int]:
    """The argmax of each row up to and including the first that disagrees with its draft (or the bonus)."""
    tokens = []
    for j, draft in enumerate(drafts):
        tokens.append(argmax[j])
        if argmax[j] != draft:
            return tokens
    tokens.append(argmax[len(drafts)])
    return tokens


def _attach_logprobs(out: list[Verified], groups, raw_lp: torch.Tensor, lp_rows: list[int], per_row: bool) -> None:
    """Each emitted token's logprobs, from its own row of `raw_lp` (the rows `lp_rows` of the step)."""
    where = {row: i for i, row in enumerate(lp_rows)}
    picked, seqs, tokens = [], [], []
    for verified, (seq, first, _) in zip(out, groups):
        if seq.sampling.logprobs is None:
            continue
        for j, token in enumerate(verified.token_ids):
            picked.append(where[first + j])
            seqs.append(seq)
            tokens.append(token)
    dev = raw_lp.device
    lps = _gather_logprobs(raw_lp[torch.tensor(picked, device=dev)], list(range(len(picked))), seqs,
                           torch.tensor(tokens, device=dev), per_row)
    at = 0
    for verified in out:
        if verified.seq.sampling.logprobs is not None:
            verified.logprobs = lps[at:at + len(verified.token_ids)]
            at += len(verified.token_ids)
