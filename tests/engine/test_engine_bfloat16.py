"""The production CPU configuration (bfloat16, packed int4 matmuls for few-row steps):
a mixed batch with chunked prefill and preemption completes with sensible text."""

import pytest

from inference.engine import Engine, EngineConfig, SamplingParams

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine():
    return Engine(EngineConfig(dtype="bfloat16", num_kv_blocks=24, max_num_seqs=8, max_num_batched_tokens=64))


def test_bfloat16_engine_serves_a_mixed_batch(engine, chat_prompts):
    start = engine.block_manager.num_free_blocks
    sp = SamplingParams(temperature=0.0, max_tokens=24)
    outs = engine.generate(chat_prompts[:8], sp)
    assert "Paris" in outs[0].delta_text
    assert all(o.finished and o.usage.completion_tokens > 0 for o in outs)
    assert all(o.delta_text == engine.tokenizer.decode(o.new_token_ids) for o in outs if o.finish_reason == "length")
    assert engine.scheduler.num_preemptions > 0  # 24 blocks cannot hold 8 such requests at once
    assert engine.block_manager.num_free_blocks == start
    # Alone, a step has one row and takes the int4 path instead of the dense matmuls of the
    # batch: bfloat16 results may differ in the last bits, so only the answer is compared.
    assert "Paris" in engine.generate([chat_prompts[0]], sp)[0].delta_text
