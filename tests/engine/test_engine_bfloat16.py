"""The production CPU configuration (bfloat16, packed int4 matmuls for few-row steps):
a mixed batch with chunked prefill and preemption completes with sensible text.

"Sensible" is judged against transformers' float32 model with teacher forcing:
every greedy bfloat16 token must be one the float32 model ranks near the top
for the same history. The exact text is not compared: bfloat16 rounding
differs between CPUs (AMX, AVX-512 and AVX2 kernels round differently), and a
135M model's greedy path can fork on a near-tie, e.g. answering the capital
question with "Paris" on one CPU and a French phrase on another.
"""

import pytest
import torch

from inference.engine import Engine, EngineConfig, SamplingParams

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine():
    return Engine(EngineConfig(dtype="bfloat16", num_kv_blocks=24, max_num_seqs=8, max_num_batched_tokens=64))


def assert_near_float32_choices(prompt, tokens, hf_logits, top=5):
    logits = hf_logits(prompt, tokens)
    for i, token in enumerate(tokens):
        rank = int((logits[i] > logits[i, token]).sum())
        assert rank < top, (i, token, rank)


def test_bfloat16_engine_serves_a_mixed_batch(engine, chat_prompts, hf_logits):
    start = engine.block_manager.num_free_blocks
    sp = SamplingParams(temperature=0.0, max_tokens=24)
    outs = engine.generate(chat_prompts[:8], sp)
    for prompt, out in zip(chat_prompts, outs):
        assert_near_float32_choices(prompt, out.new_token_ids, hf_logits)
    assert all(o.finished and o.usage.completion_tokens > 0 for o in outs)
    assert all(o.delta_text == engine.tokenizer.decode(o.new_token_ids) for o in outs if o.finish_reason == "length")
    assert engine.scheduler.num_preemptions > 0  # 24 blocks cannot hold 8 such requests at once
    assert engine.block_manager.num_free_blocks == start
    # Alone, a step has one row and takes the int4 path instead of the dense matmuls of the
    # batch: bfloat16 results may differ in the last bits, so it is judged the same way.
    alone = engine.generate([chat_prompts[0]], sp)[0]
    assert alone.finished and alone.usage.completion_tokens > 0
    assert_near_float32_choices(chat_prompts[0], alone.new_token_ids, hf_logits)
