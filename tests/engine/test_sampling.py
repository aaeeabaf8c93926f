"""Sampler, sampling parameters and stop conditions on synthetic logits."""

import math

import pytest
import torch

from inference.engine.sampler import Sampler, apply_top_k_top_p
from inference.engine.sampling_params import EngineValidationError, SamplingParams
from inference.engine.sequence import Sequence
from inference.engine.stop_checker import StopChecker

V = 50


def seq(sp: SamplingParams, prompt=(1, 2, 3), outputs=(), seed_gen=True):
    s = Sequence("r", list(prompt), sp, max_tokens=sp.max_tokens or 16)
    for t in outputs:
        s.append_token(t)
    if sp.seed is not None and seed_gen:
        s.generator = torch.Generator().manual_seed(sp.seed)
    return s


def logits_batch(n, scale=3.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, V, generator=g) * scale


@pytest.mark.parametrize(
    "kwargs,param",
    [
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 2.0}, "top_p"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": 3}, "temperature"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 1.5}, "min_p"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"frequency_penalty": -2.5}, "frequency_penalty"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"logit_bias": {V + 5: 1.0}}, "logit_bias"),
        ({"logit_bias": {3: 101}}, "logit_bias"),
        ({"seed": 2**70}, "seed"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"stop": [""]}, "stop"),
        ({"stop_token_ids": [V]}, "stop_token_ids"),
        ({"min_tokens": 20, "max_tokens": 10}, "min_tokens"),
        ({"logprobs": 21}, "top_logprobs"),
    ],
)
def test_validation_names_the_openai_param(kwargs, param):
    with pytest.raises(EngineValidationError) as err:
        SamplingParams(**kwargs).validate(vocab_size=V)
    assert err.value.param == param
    assert isinstance(err.value, ValueError)


def test_from_dict_round_trip_and_unknown_keys():
    sp = SamplingParams(max_tokens=5, stop=["x"], logit_bias={3: 2.0}, seed=7)
    again = SamplingParams.from_dict(sp.to_dict())  # JSON turns keys into strings
    assert again == sp
    assert SamplingParams.from_dict({"stop": "end"}).stop == ["end"]
    with pytest.raises(EngineValidationError) as err:
        SamplingParams.from_dict({"best_of": 2})
    assert err.value.param == "best_of"


def test_greedy_is_argmax():
    logits = logits_batch(4)
    out = Sampler(eos_token_id=0)(logits.clone(), [seq(SamplingParams(temperature=0.0)) for _ in range(4)])
    assert out.token_ids == logits.argmax(-1).tolist() and out.logprobs is None


def test_seeded_sampling_is_reproducible_and_batch_independent():
    logits = logits_batch(1, scale=1.0)
    sp = SamplingParams(temperature=1.0, seed=1234)

    def run(batch_size, steps=20):
        s = seq(sp)
        others = [seq(SamplingParams(temperature=1.0)) for _ in range(batch_size - 1)]
        sampler = Sampler(eos_token_id=None, seed=batch_size)
        toks = []
        for _ in range(steps):
            batch = torch.cat([logits_batch(len(others), seed=len(toks)), logits]) if others else logits
            toks.append(sampler(batch.clone(), others + [s]).token_ids[-1])
        return toks

    alone = run(1)
    assert alone == run(1)
    assert alone == run(7)
    assert len(set(alone)) > 3  # it really samples


def test_sampling_follows_the_distribution():
    probs = torch.tensor([0.5, 0.3, 0.2] + [0.0] * (V - 3))
    logits = probs.clamp_min(1e-30).log()
    sampler = Sampler(eos_token_id=None, seed=0)
    seqs = [seq(SamplingParams(temperature=1.0)) for _ in range(4000)]
    counts = torch.bincount(torch.tensor(sampler(logits.repeat(4000, 1), seqs).token_ids), minlength=V)
    assert counts[3:].sum() == 0
    assert abs(counts[0] / 4000 - 0.5) < 0.03 and abs(counts[2] / 4000 - 0.2) < 0.03


def test_top_k_top_p_min_p_restrict_the_support():
    base = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0] + [-10.0] * (V - 5)])
    for kwargs, allowed in [
        ({"top_k": 2}, {0, 1}),
        ({"top_p": 0.6}, {0}),  # p(0) ~ 0.64 already reaches 0.6
        ({"top_p": 0.9}, {0, 1, 2}),
        ({"min_p": 0.3}, {0, 1}),  # p(1)/p(0) = e^-1 = 0.37 >= 0.3, p(2)/p(0) = 0.14
        ({"top_k": 3, "top_p": 0.7}, {0, 1}),
    ]:
        sampler = Sampler(eos_token_id=None, seed=1)
        seqs = [seq(SamplingParams(**kwargs)) for _ in range(300)]
        got = set(sampler(base.repeat(300, 1), seqs).token_ids)
        assert got == allowed, (kwargs, got)


def test_top_p_on_a_flat_distribution_falls_back_to_a_full_sort():
    logits = torch.zeros(1, 1000)
    logits[0, :10] = 0.001  # nearly flat: the 64 best tokens hold ~6% of the mass
    apply_top_k_top_p(logits, [0], [0.5])
    assert int(torch.isfinite(logits).sum()) == 500


def test_penalties_and_logit_bias():
    logits = torch.zeros(1, V)
    logits[0, 5] = 2.0
    logits[0, 6] = -2.0
    sampler = Sampler(eos_token_id=None)
    s = seq(SamplingParams(temperature=0.0, frequency_penalty=0.5, presence_penalty=1.0), outputs=[7, 7, 7])
    out = logits.clone()
    sampler.process(out, [s])
    assert out[0, 7] == pytest.approx(-(3 * 0.5 + 1.0)) and out[0, 5] == 2.0
    s = seq(SamplingParams(temperature=0.0, repetition_penalty=2.0), prompt=[5], outputs=[6])
    out = logits.clone()
    sampler.process(out, [s])
    assert out[0, 5] == pytest.approx(1.0) and out[0, 6] == pytest.approx(-4.0) and out[0, 8] == 0.0
    s = seq(SamplingParams(temperature=0.0, logit_bias={9: 100.0}))
    assert sampler(logits.clone(), [s]).token_ids == [9]
    # A strong enough frequency penalty moves greedy off the repeated token.
    s = seq(SamplingParams(temperature=0.0, frequency_penalty=2.0), outputs=[5, 5])
    assert sampler(logits.clone(), [s]).token_ids != [5]


def test_min_tokens_masks_eos_and_stop_ids():
    logits = torch.zeros(1, V)
    logits[0, 0] = 50.0  # eos
    logits[0, 1] = 40.0  # a stop token id
    sampler = Sampler(eos_token_id=0)
    early = seq(SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[1]), outputs=[4])
    assert sampler(logits.clone(), [early]).token_ids == [2]
    out = logits.clone()
    sampler.process(out, [early])
    assert math.isinf(out[0, 0]) and math.isinf(out[0, 1])
    late = seq(SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[1]), outputs=[4, 4])
    assert sampler(logits.clone(), [late]).token_ids == [0]


def test_logprobs_are_raw_log_softmax_and_top_sums_at_most_one():
    logits = logits_batch(3)
    seqs = [seq(SamplingParams(temperature=0.7, logprobs=5, seed=3)), seq(SamplingParams(temperature=0.0)),
            seq(SamplingParams(temperature=0.0, logprobs=0))]
    out = Sampler(eos_token_id=None)(logits.clone(), seqs)
    ref = torch.log_softmax(logits, dim=-1)
    assert out.logprobs[1] is None
    for row in (0, 2):
        lp = out.logprobs[row]
        assert lp.logprob == pytest.approx(ref[row, out.token_ids[row]].item(), abs=1e-5)
    top = out.logprobs[0].top
    assert len(top) == 5 and [t for t, _ in top] == ref[0].topk(5).indices.tolist()
    assert sum(math.exp(v) for _, v in top) <= 1.0 + 1e-6
    assert out.logprobs[2].top == []


def test_stop_checker_holds_back_partial_stop_strings():
    sp = SamplingParams(stop=["END", "\n\n"])
    sc = StopChecker(sp, eos_token_id=0, max_tokens=100, max_model_len=1000)
    emitted = []
    for i, piece in enumerate(["Hello E", "N", "D? no: EN", "Dless", " x\n", "\nlater"]):
        text, hit = sc.feed(piece, i + 1)
        emitted.append(text)
        if hit:
            break
    # "Hello E" -> "E" held; "N" -> "EN" held; "D? no..." -> stop "END" found
    assert emitted[0] == "Hello " and emitted[1] == ""
    assert hit == "END" and "".join(emitted) == "Hello "
    sc = StopChecker(SamplingParams(stop=["\n\n"]), eos_token_id=0, max_tokens=100, max_model_len=1000)
    out = [sc.feed("a\n", 1), sc.feed("b\n", 2), sc.feed("\nc", 3)]
    assert out == [("a", None), ("\nb", None), ("", "\n\n")]
    sc = StopChecker(SamplingParams(stop=["xyz"]), eos_token_id=0, max_tokens=100, max_model_len=1000)
    assert sc.feed("abxy", 1) == ("ab", None) and sc.flush() == "xy"


def test_stop_checker_tokens_and_lengths():
    sc = StopChecker(SamplingParams(stop_token_ids=[9], min_tokens=2), eos_token_id=0, max_tokens=5, max_model_len=10)
    assert sc.check_token(9, 2) is None  # still within min_tokens
    assert sc.check_token(9, 3) == ("stop", 9)
    assert sc.check_token(0, 3) == ("stop", None)
    assert sc.check_length(5, 7) and sc.check_length(1, 10) and not sc.check_length(4, 9)
    ign = StopChecker(SamplingParams(ignore_eos=True), eos_token_id=0, max_tokens=5, max_model_len=10)
    assert ign.check_token(0, 1) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: the sampler runs on the logits' device")
def test_sampler_on_cuda_matches_the_cpu():
    """One batch mixing every option, sampled from the same logits on the CPU and on the GPU (where the
    engine samples without copying logits back): the same tokens for the same seeds, the same logprobs."""
    vocab = 4096

    def batch():
        params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, seed=11),
                  SamplingParams(temperature=1.0, top_k=20, seed=12), SamplingParams(temperature=0.9, top_p=0.8, seed=13),
                  SamplingParams(temperature=1.0, min_p=0.05, seed=14),
                  SamplingParams(temperature=0.7, top_k=50, top_p=0.9, seed=15, logprobs=3),
                  SamplingParams(temperature=0.0, frequency_penalty=0.5, presence_penalty=0.5, repetition_penalty=1.3),
                  SamplingParams(temperature=0.0, logit_bias={7: 60.0}, logprobs=5),
                  SamplingParams(temperature=1.0, min_tokens=4, stop_token_ids=[3], seed=16)]
        return [seq(sp, prompt=(5, 6, 7), outputs=(8, 8, 9)) for sp in params]

    g = torch.Generator().manual_seed(7)
    for step in range(5):
        logits = torch.randn(9, vocab, generator=g) * 4
        logits[:, 0] += 5.0  # eos, masked for the min_tokens row
        logits[3] *= 0.002  # a nearly flat top_p row: its 64 best tokens miss p, so it is sorted whole
        cpu = Sampler(eos_token_id=0, seed=step)(logits.clone(), batch())
        gpu = Sampler(eos_token_id=0, seed=step)(logits.clone().cuda(), batch())
        assert gpu.token_ids == cpu.token_ids
        for a, b in zip(cpu.logprobs, gpu.logprobs):
            assert (a is None) == (b is None)
            if a is not None:
                assert b.logprob == pytest.approx(a.logprob, abs=1e-4)
                assert [t for t, _ in b.top] == [t for t, _ in a.top]


def _tied_logits(vocab: int = 49_152, seed: int = 0) -> torch.Tensor:
    """One row with 300 tokens tied at the top: which of them a top-k keeps, and in which order, depends on k."""
    g = torch.Generator().manual_seed(seed)
    row = torch.zeros(1, vocab)
    row[0, torch.randint(0, vocab, (300,), generator=g)] = 4.0
    return row


def _beside(row: torch.Tensor, others: int) -> torch.Tensor:
    return torch.cat([row, torch.randn(others, row.shape[1], generator=torch.Generator().manual_seed(9))])


@pytest.mark.parametrize("per_row", [False, True])
def test_batch_invariant_sampling_does_not_depend_on_the_neighbours(per_row):
    """Batch-invariant mode (per_row) gives a row the same top_logprobs and the same top-k draw alone and beside
    rows asking for more candidates; batched (the default) the step's largest k decides ties, and differs."""
    row = _tied_logits()
    mine = SamplingParams(temperature=1.0, top_k=5, logprobs=5, seed=11)
    neighbour = SamplingParams(temperature=1.0, top_k=1000, logprobs=20, seed=12)

    def run(batch: torch.Tensor, n_neighbours: int):
        seqs = [seq(mine)] + [seq(neighbour) for _ in range(n_neighbours)]
        out = Sampler(eos_token_id=None, per_row=per_row)(batch.clone(), seqs)
        return out.token_ids[0], out.logprobs[0].top

    alone = run(row, 0)
    beside = run(_beside(row, 3), 3)
    if per_row:
        assert beside == alone
    else:  # the control: the gap the mode closes is real
        assert beside[1] != alone[1]
