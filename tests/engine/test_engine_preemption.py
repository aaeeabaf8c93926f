"""A KV budget too small for every request at once: preemption by recompute keeps
outputs identical, and the free block count returns to its start after finish/abort."""

import pytest

from inference.engine import SamplingParams

pytestmark = pytest.mark.slow

G = SamplingParams(temperature=0.0, max_tokens=40, min_tokens=40)


@pytest.fixture(scope="module")
def reference(make_engine, chat_prompts):
    engine = make_engine(enable_prefix_caching=False)
    return [o.new_token_ids for o in engine.generate(chat_prompts[:8], G)]


@pytest.mark.parametrize("caching", [False, True])
def test_all_complete_with_the_same_outputs_under_a_tiny_kv_budget(make_engine, chat_prompts, reference, caching):
    # 8 requests of ~40-60 prompt + 40 output tokens need ~6 blocks each; 16 blocks hold ~2.5 of them.
    engine = make_engine(num_kv_blocks=16, enable_prefix_caching=caching, max_num_batched_tokens=128)
    start = engine.block_manager.num_free_blocks
    outs = engine.generate(chat_prompts[:8], G)
    assert engine.scheduler.num_preemptions > 0
    assert [o.new_token_ids for o in outs] == reference
    assert all(o.finish_reason == "length" and o.usage.completion_tokens == 40 for o in outs)
    if not caching:  # (with caching on, the shared system prompt legitimately hits)
        assert all(o.usage.cached_tokens == 0 for o in outs)
    assert engine.block_manager.num_free_blocks == start == engine.block_manager.num_blocks
    engine.block_manager.check_invariants([])


def test_free_blocks_return_after_aborts(make_engine, chat_prompts, reference):
    engine = make_engine(num_kv_blocks=24, max_num_seqs=4, max_num_batched_tokens=128)
    start = engine.block_manager.num_free_blocks
    for i, p in enumerate(chat_prompts[:8]):
        engine.add_request(f"r{i}", p, G)
    for _ in range(6):
        engine.step()
    running = [s.request_id for s in engine.scheduler.running]
    waiting = [s.request_id for s in engine.scheduler.waiting]
    assert running and waiting
    aborted = {running[0], waiting[-1]}
    for rid in aborted:
        assert engine.abort(rid)
    assert not engine.abort("no-such-request")
    engine.block_manager.check_invariants(list(engine.scheduler.requests.values()))
    finished, tokens = {}, {f"r{i}": [] for i in range(8)}
    first = True
    while engine.has_unfinished():
        outs = engine.step()
        if first:  # the abort notices come with the very next step
            assert {o.request_id for o in outs if o.finish_reason == "abort"} == aborted
            first = False
        for o in outs:
            tokens[o.request_id] += o.new_token_ids
            if o.finished:
                finished[o.request_id] = o.finish_reason
    assert set(finished) == {f"r{i}" for i in range(8)}
    for i in range(8):
        rid = f"r{i}"
        if rid not in aborted:
            assert finished[rid] == "length"
    assert engine.block_manager.num_free_blocks == start
    engine.block_manager.check_invariants([])
