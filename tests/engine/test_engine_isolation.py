"""One request cannot fail the others (issue: `top_k` >= the vocabulary crashed every request of a step).

- `top_k` at or above the vocabulary means no top-k filtering: validation sets it to 0 and the sampler
  filters nothing for it, whatever else the batch holds.
- A step that raises ends only the request that made it fail (the batch is bisected and rerun): the
  others produce exactly the tokens they produce alone, in every step order; the culprit ends with
  "error" and its blocks are freed.
- A failure in one sequence's own token handling (detokenizing) ends that sequence alone.
- A step that fails for every request ends each once and the engine takes no more (dead).
"""

from __future__ import annotations

import pytest
import torch

from inference.engine import EngineDeadError, SamplingParams
from inference.engine.sampler import Sampler, apply_top_k_top_p
from tests.engine.test_engine_async_output import run_steps, summary

pytestmark = pytest.mark.slow

HUGE_TOP_K = [49152, 50000, 2**31 - 1, 2**63]
STEP_ORDERS = [
    {"async_output": False},
    {"async_output": True},
    {"async_scheduling": True},
]
STEP_ORDER_IDS = ["sync", "async_output", "async_scheduling"]


@pytest.mark.parametrize("top_k", HUGE_TOP_K)
def test_a_top_k_at_or_above_the_vocabulary_filters_nothing(top_k):
    params = SamplingParams(temperature=0.8, top_k=top_k).validate(vocab_size=49152)
    assert params.top_k == 0
    assert SamplingParams(temperature=0.8, top_k=49151).validate(vocab_size=49152).top_k == 49151


@pytest.mark.parametrize("top_k", HUGE_TOP_K)
def test_the_sampler_survives_a_top_k_it_was_not_told_to_ignore(top_k):
    """Defence in depth: even unvalidated, a k >= vocab keeps every token (no crash, no filtering)."""
    logits = torch.randn(3, 100)
    before = logits.clone()
    apply_top_k_top_p(logits, [top_k, 0, top_k], [1.0, 1.0, 1.0])
    assert torch.equal(logits, before)

    class _Seq:  # the fields the sampler reads
        def __init__(self, k):
            self.sampling = SamplingParams(temperature=0.8, top_k=k)
            self.generator, self.num_output_tokens, self.pending = None, 0, 0

    tokens = Sampler(eos_token_id=None)(torch.randn(2, 100), [_Seq(top_k), _Seq(5)]).token_ids
    assert len(tokens) == 2 and all(0 <= t < 100 for t in tokens)


@pytest.mark.parametrize("top_k", HUGE_TOP_K)
def test_the_engine_runs_a_huge_top_k_beside_other_requests(make_engine, chat_prompts, top_k):
    engine = make_engine()
    sp = [SamplingParams(temperature=0.8, top_k=top_k, seed=3, max_tokens=6),
          SamplingParams(temperature=0.0, max_tokens=6)]
    outs = engine.generate(chat_prompts[:2], sp)
    assert [o.finish_reason for o in outs] == ["length", "length"]
    assert all(len(o.new_token_ids) == 6 for o in outs)


def _good_requests(chat_prompts):
    return [
        ("greedy", chat_prompts[0], SamplingParams(temperature=0.0, max_tokens=12)),
        ("seeded", chat_prompts[2], SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=12)),
        ("other", chat_prompts[4], SamplingParams(temperature=0.0, max_tokens=12, stop=["\n"])),
    ]


def _sampling_raises_for(engine, request_id: str, after_steps: int = 0):
    """The test hook: the engine's sampling raises whenever `request_id` is among the rows (from its
    `after_steps`-th sampled step on), as a bug in one request's sampling would."""
    launch = engine.sampler.launch
    seen = {"n": 0}

    def failing_launch(logits, seqs):
        if any(s.request_id == request_id for s in seqs):
            seen["n"] += 1
            if seen["n"] > after_steps:
                raise RuntimeError(f"sampling blew up on {request_id}")
        return launch(logits, seqs)

    engine.sampler.launch = failing_launch
    return seen


@pytest.mark.parametrize("order", STEP_ORDERS, ids=STEP_ORDER_IDS)
def test_a_failing_request_ends_alone_and_the_others_match_their_solo_runs(make_engine, chat_prompts, order):
    good = _good_requests(chat_prompts)
    alone = {}
    for rid, prompt, sp in good:  # each one alone, float32
        outs, _ = run_steps(make_engine(**order), [(rid, prompt, sp)])
        alone[rid] = summary(outs[rid])

    engine = make_engine(**order)
    bad = ("bad", chat_prompts[5], SamplingParams(temperature=0.0, max_tokens=12))
    hits = _sampling_raises_for(engine, "bad", after_steps=2)  # fails mid-stream, after two tokens
    seen, _ = run_steps(engine, good + [bad])
    for rid, _, _ in good:
        assert summary(seen[rid]) == alone[rid], rid
    final = seen["bad"][-1]
    assert final.finished and final.finish_reason == "error"
    assert "sampling blew up on bad" in final.error
    assert sum(o.finished for o in seen["bad"]) == 1  # ended once
    assert hits["n"] >= 3
    assert engine.dead is None
    assert not engine.has_unfinished()
    bm = engine.block_manager
    bm.check_invariants([])
    assert bm.num_free_blocks == bm.num_blocks


def test_blocks_of_a_failed_request_are_freed_while_the_others_run(make_engine, chat_prompts):
    engine = make_engine()
    _sampling_raises_for(engine, "bad")
    engine.add_request("bad", chat_prompts[1], SamplingParams(temperature=0.0, max_tokens=20))
    engine.add_request("ok", chat_prompts[0], SamplingParams(temperature=0.0, max_tokens=20))
    outs = engine.step()
    assert [(o.request_id, o.finish_reason) for o in outs if o.finished] == [("bad", "error")]
    assert "bad" not in engine.scheduler.requests
    live = list(engine.scheduler.requests.values())
    assert [s.request_id for s in live] == ["ok"]
    engine.block_manager.check_invariants(live)


def test_a_failure_in_one_sequences_detokenizing_ends_it_alone(make_engine, chat_prompts):
    engine = make_engine()
    good = _good_requests(chat_prompts)
    expected = {rid: summary(run_steps(make_engine(), [(rid, p, sp)])[0][rid]) for rid, p, sp in good}
    for rid, prompt, sp in good + [("bad", chat_prompts[5], SamplingParams(temperature=0.0, max_tokens=12))]:
        engine.add_request(rid, prompt, sp)
    seq = engine.scheduler.requests["bad"]

    class BrokenDetokenizer:
        def add(self, token):
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "broken detokenizer")

        def finish(self):
            return ""

    seq.detok = BrokenDetokenizer()
    seen: dict[str, list] = {}
    while engine.has_unfinished():
        for out in engine.step():
            seen.setdefault(out.request_id, []).append(out)
    assert seen["bad"][-1].finish_reason == "error" and "broken detokenizer" in seen["bad"][-1].error
    for rid, _, _ in good:
        assert summary(seen[rid]) == expected[rid], rid
    engine.block_manager.check_invariants([])


@pytest.mark.parametrize("order", STEP_ORDERS, ids=STEP_ORDER_IDS)
def test_a_step_that_always_raises_ends_every_request_once_and_the_engine_stops(make_engine, chat_prompts, order):
    engine = make_engine(**order)
    calls = {"n": 0}

    def broken_run(*args, **kwargs):
        calls["n"] += 1
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    engine.runner.run = broken_run
    for i in range(4):
        engine.add_request(f"r{i}", chat_prompts[i], SamplingParams(temperature=0.0, max_tokens=8))
    ended: dict[str, list] = {}
    for _ in range(3):
        for out in engine.step():
            ended.setdefault(out.request_id, []).append(out)
    assert sorted(ended) == ["r0", "r1", "r2", "r3"]
    for rid, outs in ended.items():
        assert len(outs) == 1 and outs[0].finished and outs[0].finish_reason == "error", rid
    assert engine.dead and "illegal memory access" in engine.dead
    assert not engine.has_unfinished()
    assert calls["n"] <= 1 + 2 * 4  # the batch, then its parts: bounded, no spinning
    with pytest.raises(EngineDeadError):
        engine.add_request("late", chat_prompts[0], SamplingParams(temperature=0.0, max_tokens=4))
    engine.block_manager.check_invariants([])


def test_one_request_failing_alone_does_not_kill_the_engine_but_three_steps_in_a_row_do(make_engine, chat_prompts):
    engine = make_engine()
    engine.runner.run = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("device gone"))
    for i in range(3):
        engine.add_request(f"solo{i}", chat_prompts[i], SamplingParams(temperature=0.0, max_tokens=4))
        outs = engine.step()
        while engine.has_unfinished():
            outs += engine.step()
        assert [(o.request_id, o.finish_reason) for o in outs] == [(f"solo{i}", "error")]
        assert (engine.dead is None) == (i < 2)
