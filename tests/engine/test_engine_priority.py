"""Priorities on the real model: a high-priority request added to a saturated engine
gets its first token before the queued low-priority ones."""

import pytest

from inference.engine import SamplingParams

pytestmark = pytest.mark.slow


def test_high_priority_request_overtakes_queued_low_priority_ones(make_engine, chat_prompts):
    engine = make_engine(max_num_seqs=4, max_num_batched_tokens=256)
    low = SamplingParams(temperature=0.0, max_tokens=24, min_tokens=24)
    for i in range(4):
        engine.add_request(f"run{i}", chat_prompts[i], low, priority=5)
    engine.step()
    assert len(engine.scheduler.running) == 4  # the seat cap is full
    for i in range(4):
        engine.add_request(f"queued{i}", chat_prompts[4 + i], low, priority=5)
    engine.step()
    engine.add_request("vip", chat_prompts[8], SamplingParams(temperature=0.0, max_tokens=4), priority=0)
    first_token_step: dict[str, int] = {}
    step = 0
    while engine.has_unfinished():
        step += 1
        for out in engine.step():
            if out.new_token_ids:
                first_token_step.setdefault(out.request_id, step)
    assert first_token_step["vip"] == 1  # admitted at once, preempting a running low-priority request
    assert all(first_token_step["vip"] < first_token_step[f"queued{i}"] for i in range(4))
    assert engine.scheduler.num_preemptions >= 1
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
