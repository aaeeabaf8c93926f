"""Batched token sampling for the rows of a step that produce a token.

Order per row (as in HF/vLLM): raw logits -> logprobs (reported from the raw
model distribution, log_softmax of the unmodified logits, like OpenAI) ->
the grammar's token mask (rows with a structured output: inference.engine.structured_mask) ->
repetition/presence/frequency penalties -> logit_bias -> min_tokens mask ->
greedy argmax, or temperature -> top_k -> top_p -> min_p -> one draw.

A draw uses inverse-CDF sampling with ONE uniform number per row. Seeded
requests take it from their own torch.Generator, so a seed reproduces the same
tokens whatever else shares the batch; the rest share the engine's generator.

Everything runs on the logits' device (on a GPU the logits never leave it);
the uniforms are drawn on the CPU, so a seed gives the same numbers on every
device, and only the chosen token ids (and requested logprobs) come back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from inference.engine.sequence import Sequence
from kernels.fused_ops_cpu import argmax_cpu

_NUCLEUS_CANDIDATES = 64  # top-p first looks among this many tokens, sorting all only if needed


@dataclass(slots=True)
class SampledLogprobs:
    logprob: float  # of the chosen token
    top: list[tuple[int, float]]  # (token_id, logprob), best first; empty when k == 0


@dataclass(slots=True)
class PendingSample:
    """Tokens chosen on the device, not yet read back (``Sampler.finish`` reads them)."""

    tokens: torch.Tensor
    raw_lp: torch.Tensor | None
    lp_rows: list[int]
    seqs: list[Sequence]
    host_tokens: torch.Tensor | None = None  # CUDA: a pinned copy of `tokens`, filled by the time `ready` is
    ready: object = None  # ... reached: a torch.cuda.Event recorded after that copy


@dataclass(slots=True)
class SamplerOutput:
    token_ids: list[int]
    logprobs: list[SampledLogprobs | None] | None  # per row; None when no row asked


class Sampler:
    """`per_row` (batch-invariant mode): every sampled row is filtered and drawn on its own, and its logprobs
    ranked with its own k. Batched, a row's candidate width is the step's largest (so ties at its k-th place,
    and whether top-p sorts the whole row, depend on its neighbours), and a reduction over a one-row tensor
    may take another order than over several (torch splits one long row across threads on the CPU; CUDA
    scans a single row with another kernel)."""

    def __init__(self, *, eos_token_id: int | None, seed: int = 0, per_row: bool = False) -> None:
        self.eos_token_id = eos_token_id
        self.generator = torch.Generator().manual_seed(seed)
        self.per_row = per_row
        self.masker = None  # GrammarMasker, built at the first row with a grammar (none: no cost at all)

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> SamplerOutput:
        return self.finish(self.launch(logits, seqs))

    @torch.inference_mode()
    def finish(self, pending: PendingSample) -> SamplerOutput:
        """Read the chosen tokens back (on a GPU: waits for the step's work)."""
        tokens, rows = pending.tokens, pending.lp_rows
        if pending.ready is not None:  # waits for this step's sampling only, not for later launches
            pending.ready.synchronize()
            token_ids = pending.host_tokens.tolist()
        else:
            token_ids = tokens.tolist()
        logprobs = _gather_logprobs(pending.raw_lp, rows, pending.seqs, tokens, self.per_row) if rows else None
        return SamplerOutput(token_ids, logprobs)

    @torch.inference_mode()
    def launch(self, logits: torch.Tensor, seqs: list[Sequence]) -> PendingSample:
        """Queue the sampling work on the logits' device, and on CUDA the copy of the chosen ids to the
        host. Nothing here waits for the GPU unless a row uses top-k/top-p, penalties or logprobs."""
        logits = logits.float()
        dev = logits.device
        lp_rows = [i for i, s in enumerate(seqs) if s.sampling.logprobs is not None]
        raw_lp = None
        if lp_rows and self.per_row:
            raw_lp = torch.cat([torch.log_softmax(logits[i:i + 1], dim=-1) for i in lp_rows])
        elif lp_rows:
            raw_lp = torch.log_softmax(logits[_to_device(torch.tensor(lp_rows), dev)], dim=-1)
        g_rows = [i for i, s in enumerate(seqs) if getattr(s, "grammar", None) is not None]  # (stand-ins lack it)
        if g_rows:
            self._grammar_masker().apply(logits, seqs, g_rows)
        self.process(logits, seqs)
        greedy = [s.sampling.greedy for s in seqs]
        if all(greedy):
            tokens = argmax_cpu(logits)  # the first maximum, as logits.max(dim=-1).indices (natively on the CPU)
        elif not any(greedy):
            tokens = self._sample_rows(logits, seqs)
        else:
            tokens = torch.empty(len(seqs), dtype=torch.long, device=dev)
            g_rows = [i for i, g in enumerate(greedy) if g]
            r_rows = [i for i, g in enumerate(greedy) if not g]
            idx = _to_device(torch.tensor(g_rows), dev)
            tokens[idx] = argmax_cpu(logits[idx])
            idx = _to_device(torch.tensor(r_rows), dev)
            tokens[idx] = self._sample_rows(logits[idx], [seqs[i] for i in r_rows])
        pending = PendingSample(tokens, raw_lp, lp_rows, seqs)
        if dev.type == "cuda":
            pending.host_tokens = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            pending.host_tokens.copy_(tokens, non_blocking=True)
            pending.ready = torch.cuda.Event()
            pending.ready.record()
        return pending

    def _grammar_masker(self):
        if self.masker is None:
            from inference.engine.structured_mask import GrammarMasker

            self.masker = GrammarMasker(self.eos_token_id)
        return self.masker

    def process(self, logits: torch.Tensor, seqs: list[Sequence]) -> None:
        """Penalties, logit_bias and the min_tokens ban, in place."""
        pen_rows = [i for i, s in enumerate(seqs) if s.sampling.has_penalties]
        if pen_rows:
            apply_penalties(logits, pen_rows, seqs)
        dev = logits.device
        for i, s in enumerate(seqs):
            sp = s.sampling
            if sp.logit_bias:
                ids = _to_device(torch.tensor(list(sp.logit_bias.keys())), dev)
                logits[i, ids] += _to_device(torch.tensor(list(sp.logit_bias.values()), dtype=logits.dtype), dev)
            # pending: sampled, not yet appended. A grammar decides alone where its output ends (EOS banned
            # where it is the only token the grammar allows would leave nothing to sample).
            if s.num_output_tokens + s.pending < sp.min_tokens and getattr(s, "grammar", None) is None:
                banned = list(sp.stop_token_ids)
                if self.eos_token_id is not None and not sp.ignore_eos:
                    banned.append(self.eos_token_id)
                if banned:
                    logits[i, _to_device(torch.tensor(banned), dev)] = -float("inf")

    def _sample_rows(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        if not self.per_row or len(seqs) == 1:
            return self._sample(logits, seqs)
        return torch.cat([self._sample(logits[i:i + 1], [s]) for i, s in enumerate(seqs)])

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        return inverse_cdf_draw(self.probs(logits, seqs), _to_device(self.uniforms(seqs), logits.device))

    def probs(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        """The distribution each row draws from (temperature, top-k, top-p, min-p; the logits are processed
        already); the logits are modified in place."""
        dev = logits.device
        temps = _to_device(torch.tensor([s.sampling.temperature for s in seqs], dtype=logits.dtype), dev)
        logits.div_(temps[:, None])
        vocab = logits.shape[1]
        top_ks = [s.sampling.top_k for s in seqs]
        top_ps = [s.sampling.top_p for s in seqs]
        min_ps = [s.sampling.min_p for s in seqs]
        if any(0 < k < vocab for k in top_ks) or any(p < 1.0 for p in top_ps):
            apply_top_k_top_p(logits, top_ks, top_ps)
        probs = logits.softmax(dim=-1)
        if any(m > 0.0 for m in min_ps):
            m = _to_device(torch.tensor(min_ps, dtype=probs.dtype), dev)[:, None]
            probs = probs.masked_fill(probs < m * probs.amax(dim=-1, keepdim=True), 0.0)
        return probs

    def uniforms(self, seqs: list[Sequence]) -> torch.Tensor:
        """One uniform per row, drawn on the CPU: a seed gives the same numbers on every device."""
        u = torch.rand(len(seqs), generator=self.generator, dtype=torch.float64)
        for i, s in enumerate(seqs):
            if s.generator is not None:
                u[i] = torch.rand(1, generator=s.generator, dtype=torch.float64)[0]
        return u


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small CPU tensor onto ``device`` without a host sync (pinned, asynchronous) on CUDA."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def _gather_logprobs(raw_lp, rows, seqs, tokens, per_row: bool = False) -> list[SampledLogprobs | None]:
    idx = torch.tensor(rows, device=raw_lp.device)
    chosen = raw_lp.gather(1, tokens[idx][:, None]).squeeze(1).tolist()
    k = max(seqs[i].sampling.logprobs for i in rows)
    top_v = top_i = None
    if k and per_row:  # each row ranked with its own k: which of several tied tokens comes first depends on k
        top_v, top_i = [], []
        for j, i in enumerate(rows):
            values, indices = raw_lp[j:j + 1].topk(seqs[i].sampling.logprobs, dim=-1)
            top_v.append(values[0].tolist())
            top_i.append(indices[0].tolist())
    elif k:
        top_v, top_i = raw_lp.topk(k, dim=-1)
        top_v, top_i = top_v.tolist(), top_i.tolist()
    out: list[SampledLogprobs | None] = [None] * len(seqs)
    for j, i in enumerate(rows):
        kk = seqs[i].sampling.logprobs
        out[i] = SampledLogprobs(chosen[j], list(zip(top_i[j][:kk], top_v[j][:kk])) if kk else [])
    return out


def apply_penalties(logits: torch.Tensor, rows: list[int], seqs: list[Sequence]) -> None:
    """OpenAI presence/frequency penalties over generated tokens; HF-style repetition
    penalty over prompt and generated tokens. In place on `logits[rows]`."""
    vocab, dev = logits.shape[1], logits.device
    sub_seqs = [seqs[i] for i in rows]
    idx = torch.tensor(rows, device=dev)
    sub = logits[idx]
    counts = _token_counts([s.output_token_ids for s in sub_seqs], vocab, dev)
    freq = torch.tensor([s.sampling.frequency_penalty for s in sub_seqs], device=dev)[:, None]
    pres = torch.tensor([s.sampling.presence_penalty for s in sub_seqs], device=dev)[:, None]
    sub -= counts * freq + (counts > 0).float() * pres
    reps = [s.sampling.repetition_penalty for s in sub_seqs]
    if any(r != 1.0 for r in reps):
        seen = (counts > 0) | (_token_counts([s.prompt_token_ids for s in sub_seqs], vocab, dev) > 0)
        rep = torch.tensor(reps, device=dev)[:, None].expand_as(sub)
        sub = torch.where(seen, torch.where(sub > 0, sub / rep, sub * rep), sub)
    logits[idx] = sub


def _token_counts(lists: list[list[int]], vocab: int, device: torch.device) -> torch.Tensor:
    width = max((len(t) for t in lists), default=0)
    counts = torch.zeros(len(lists), vocab + 1, device=device)
    if width:
        padded = torch.tensor([t + [vocab] * (width - len(t)) for t in lists], dtype=torch.long, device=device)
        counts.scatter_add_(1, padded, torch.ones(padded.shape, device=device))
    return counts[:, :vocab]


def apply_top_k_top_p(logits: torch.Tensor, top_ks: list[int], top_ps: list[float]) -> None:
    """Mask (to -inf) tokens outside each row's top-k, then outside the nucleus of what
    is left (renormalised over the top-k, as HF and vLLM do). In place. A k of 0, -1
    or at least the vocabulary size filters nothing (vLLM's meaning).

    Only the best `C` tokens per row are examined (C = the largest k, at least 64 when
    some row uses top_p); a top_p row whose C best tokens do not reach p is sorted whole.
    """
    vocab, dev = logits.shape[1], logits.device
    ks = torch.tensor([k if 0 < k < vocab else vocab for k in top_ks], device=dev)
    ps = torch.tensor(top_ps, dtype=logits.dtype, device=dev)
    has_k, has_p = ks < vocab, ps < 1.0
    nucleus = [_NUCLEUS_CANDIDATES] if any(p < 1.0 for p in top_ps) else []
    widths = [k for k in top_ks if 0 < k < vocab] + nucleus
    if not widths:
        return  # no row filters anything
    width = min(vocab, max(widths))
    values, indices = logits.topk(width, dim=-1)
    in_k = torch.arange(width, device=dev)[None, :] < ks[:, None]
    kept_vals = values.masked_fill(~in_k, -float("inf"))
    lse = torch.where(
        has_k[:, None],
        torch.logsumexp(kept_vals, dim=-1, keepdim=True),
        torch.logsumexp(logits, dim=-1, keepdim=True),
    )
    probs = (kept_vals - lse).exp()
    cum = probs.cumsum(dim=-1)
    in_p = ((cum - probs) < ps[:, None]) | ~has_p[:, None]
    keep = in_k & in_p
    keep[:, 0] = True
    needs_sort = has_p & ~has_k & (cum[:, -1] < ps)
    active = (has_k | has_p) & ~needs_sort
    if bool(active.any()):
        rows = active.nonzero().squeeze(1)
        filtered = torch.full((len(rows), vocab), -float("inf"), dtype=logits.dtype, device=dev)
        filtered.scatter_(1, indices[rows], torch.where(keep[rows], values[rows], -float("inf")))
        logits[rows] = filtered
    for i in needs_sort.nonzero().squeeze(1).tolist():
        sorted_l, order = logits[i].sort(descending=True)
        p = sorted_l.softmax(dim=-1)
        n_keep = max(1, int(((p.cumsum(0) - p) < top_ps[i]).sum()))
        logits[i, order[n_keep:]] = -float("inf")


def inverse_cdf_draw(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    cdf = probs.double().cumsum_(dim=-1)
    target = uniforms[:, None] * cdf[:, -1:]
    out = torch.searchsorted(cdf, target, right=True).squeeze(1)
    return out.clamp_(max=probs.shape[1] - 1)
