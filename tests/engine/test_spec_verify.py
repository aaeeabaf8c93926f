"""Verifying drafts (inference.engine.spec_verify): greedy runs, and speculative sampling's output distribution
against plain sampling's, by a chi-square test on a small vocabulary."""

import pytest
import torch

from inference.engine import SamplingParams
from inference.engine.sampler import Sampler
from inference.engine.sequence import Sequence
from inference.engine.spec_verify import SpecVerifier, row_groups

# chi-square critical values at p = 0.001 by degrees of freedom (a seeded test: it either holds or not)
CHI2_999 = {3: 16.27, 4: 18.47, 5: 20.52}
VOCAB = 6


def _seq(drafts, rid="r", seed=None, **sampling) -> Sequence:
    seq = Sequence(rid, [1, 2, 3], SamplingParams(max_tokens=16, seed=seed, **sampling), max_tokens=16)
    seq.spec_tokens = list(drafts)
    if seed is not None:
        seq.generator = torch.Generator().manual_seed(seed)
    return seq


def test_greedy_keeps_drafts_while_they_are_the_argmax():
    logits = torch.full((4, VOCAB), -1.0)
    for row, best in enumerate([2, 4, 1, 5]):
        logits[row, best] = 3.0
    verifier = SpecVerifier(Sampler(eos_token_id=None))
    seq = _seq([2, 4, 0], temperature=0.0)  # the third draft is refused: row 2 says 1
    (got,) = verifier.verify(logits.clone(), [seq] * 4)
    assert (got.token_ids, got.drafted, got.accepted) == ([2, 4, 1], 3, 2)
    seq = _seq([2, 4, 1], temperature=0.0)  # all kept: the bonus from the last row
    (got,) = verifier.verify(logits.clone(), [seq] * 4)
    assert (got.token_ids, got.accepted) == ([2, 4, 1, 5], 3)
    seq = _seq([3, 4, 1], temperature=0.0)
    (got,) = verifier.verify(logits.clone(), [seq] * 4)
    assert (got.token_ids, got.accepted) == ([2], 0)


def test_row_groups_follow_each_sequence():
    a, b = _seq([1]), _seq([1, 2], rid="b")
    assert row_groups([a, a, b, b, b]) == [(a, 0, 2), (b, 2, 3)]


def _chi2(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    keep = expected > 0
    return float((((counts - expected) ** 2)[keep] / expected[keep]).sum())


@pytest.mark.slow
def test_speculative_sampling_has_plain_sampling_distribution():
    """Each emitted token follows its row's distribution: the first ~ p0; the second, given the first draft was
    kept, ~ p1. Drafts: one the model likes (often kept) and one it does not."""
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(3, VOCAB, generator=gen) * 1.5
    sampling = dict(temperature=0.8, top_k=5)
    sampler = Sampler(eos_token_id=None, seed=3)
    verifier = SpecVerifier(sampler)
    rows = sampler.probs(logits.clone(), [_seq([])] * 3)  # what plain sampling draws each row from
    drafts = [int(rows[0].argmax()), int(rows[1].argmin())]
    first, second = torch.zeros(VOCAB), torch.zeros(VOCAB)
    lengths = torch.zeros(4)
    seq = _seq(drafts, **sampling)
    trials = 12000
    for _ in range(trials):
        tokens = verifier._sampled_run(logits.clone(), seq, drafts)
        first[tokens[0]] += 1
        if tokens[0] == drafts[0]:
            second[tokens[1]] += 1
        lengths[len(tokens)] += 1
    rows = sampler.probs(logits.clone(), [seq] * 3)
    assert rows[0, 5 - 1:].numel() and (rows[0] == 0).sum() >= 1  # top_k=5 of 6 masks one token
    dof = int((rows[0] > 0).sum()) - 1
    assert _chi2(first, rows[0]) < CHI2_999[dof]
    dof = int((rows[1] > 0).sum()) - 1
    assert _chi2(second, rows[1]) < CHI2_999[dof]
    # the first draft is kept as often as p0 gives it; the unlikely second one rarely
    assert abs(float(first[drafts[0]]) / trials - float(rows[0, drafts[0]])) < 0.02
    assert lengths[3] < 0.2 * trials


def test_seeded_speculative_sampling_repeats_itself():
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(1))
    runs = []
    for _ in range(2):
        seq = _seq([1, 2], seed=42, temperature=1.0)
        verifier = SpecVerifier(Sampler(eos_token_id=None, seed=0))
        runs.append([verifier._sampled_run(logits.clone(), seq, [1, 2]) for _ in range(20)])
    assert runs[0] == runs[1]


def test_logprobs_are_each_emitted_tokens_own_row():
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(2))
    drafts = [int(logits[0].argmax()), int(logits[1].argmax())]
    seq = _seq(drafts, temperature=0.0, logprobs=2)
    (got,) = SpecVerifier(Sampler(eos_token_id=None)).verify(logits.clone(), [seq] * 3)
    raw = torch.log_softmax(logits, dim=-1)
    assert got.token_ids == [*drafts, int(logits[2].argmax())]
    for row, (token, lp) in enumerate(zip(got.token_ids, got.logprobs)):
        assert abs(lp.logprob - float(raw[row, token])) < 1e-6
        assert [t for t, _ in lp.top] == raw[row].topk(2).indices.tolist()
