"""Issue 37: a model whose every layer is windowed (a tiny random Mistral, sliding_window 16, float32) through the
engine gives back the KV blocks behind the window while its sequences run, and still gives transformers' greedy
tokens: sequences several windows long in prefill chunks, a prefix-cache hit on blocks given back, preemption
under a small KV budget, batch-invariant mode. A sequence holds about window / block_size + 2 blocks, so a budget
too small for one whole sequence runs it; a model with one global layer (Gemma 3) frees nothing."""

from __future__ import annotations

import pytest

from inference.engine import Engine, EngineConfig, SamplingParams
from inference.engine.block_manager import NULL_BLOCK
from inference.engine.sampling_params import PromptTooLongError
from tests.engine.arch_helpers import TINY_DIMS, hf_greedy, loaded_with_tokenizer, random_prompt, tiny_hf_model

WINDOW = 16


@pytest.fixture(scope="module")
def tiny_mistral(tmp_path_factory, smollm_tokenizer):
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(**TINY_DIMS, num_hidden_layers=2, sliding_window=WINDOW)
    hf = tiny_hf_model(MistralForCausalLM, config, seed=4)
    return loaded_with_tokenizer(hf, tmp_path_factory.mktemp("mistral"), smollm_tokenizer)


def window_engine(loaded, **config) -> Engine:
    settings = dict(model=loaded.source.path, device="cpu", dtype="float32", num_kv_blocks=64, max_num_seqs=4,
                    block_size=16, max_num_batched_tokens=20) | config
    return Engine(EngineConfig(**settings), loaded=loaded)


def greedy(steps: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=steps, ignore_eos=True)


def held(seq) -> int:
    return sum(b != NULL_BLOCK for b in seq.block_table)


def run_watching_blocks(engine: Engine, prompts: list[list[int]], steps: int) -> tuple[list[list[int]], int]:
    """Run `prompts` step by step, checking the block bookkeeping and each sequence's blocks after every step.
    -> (the tokens of each, the most blocks a decoding sequence held)."""
    bm, scheduler = engine.block_manager, engine.scheduler
    for i, prompt in enumerate(prompts):
        engine.add_request(f"w{i}", prompt, greedy(steps))
    tokens = {f"w{i}": [] for i in range(len(prompts))}
    most, computed = 0, {}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
        bm.check_invariants(list(scheduler.requests.values()))
        for seq in scheduler.running:
            chunk = engine.config.max_num_batched_tokens
            assert held(seq) <= bm.peak_blocks(seq.num_tokens + steps, chunk)
            if seq.num_computed_tokens == computed.get(seq.request_id, -9) + 1:  # a decode step
                most = max(most, held(seq))
            computed[seq.request_id] = seq.num_computed_tokens
    assert bm.num_free_blocks == bm.capacity == bm.num_blocks - 1  # all back, less the null block
    bm.check_invariants([])
    return [tokens[f"w{i}"] for i in range(len(prompts))], most


@pytest.mark.parametrize("mode", ["plain", "batch_invariant", "async_scheduling"])
@pytest.mark.parametrize("block_size", [16, 4])
def test_long_sequences_in_chunks_give_transformers_tokens_holding_a_window(tiny_mistral, block_size, mode):
    loaded, hf = tiny_mistral
    assert loaded.config.kv_window == WINDOW
    prompts = [random_prompt(45, seed=20), random_prompt(70, seed=21)]  # with 40 tokens: 5 and 7 windows
    # async scheduling (the CUDA default): blocks are given back while a step's token is still pending
    engine = window_engine(loaded, block_size=block_size, **({mode: True} if mode != "plain" else {}))
    assert engine.block_manager.window == WINDOW
    tokens, most = run_watching_blocks(engine, prompts, steps=40)
    assert tokens == [hf_greedy(hf, p, 40) for p in prompts]
    assert most == WINDOW // block_size + 2  # of the 7 (28) blocks a 110-token sequence spans


@pytest.mark.parametrize("batch_invariant", [False, True])
def test_a_prefix_hit_on_blocks_given_back_gives_transformers_tokens(tiny_mistral, batch_invariant):
    loaded, hf = tiny_mistral
    shared = random_prompt(70, seed=22)
    prompts = [shared + random_prompt(10, seed=23), shared + random_prompt(6, seed=24)]
    expected = [hf_greedy(hf, p, 24) for p in prompts]
    engine = window_engine(loaded, batch_invariant=batch_invariant)
    bm = engine.block_manager
    first = engine.generate([prompts[0]], greedy(24))[0]
    assert first.usage.cached_tokens == 0 and first.new_token_ids == expected[0]
    # the first request gave back its first 4 blocks while it ran (104 tokens): they stayed in the prefix cache
    engine.add_request("second", prompts[1], greedy(24))
    outs = engine.step()  # admitted after its hit, its 12 other prompt tokens computed
    table = list(engine.scheduler.requests["second"].block_table)
    while engine.has_unfinished():
        outs += engine.step()
    assert [t for o in outs for t in o.new_token_ids] == expected[1]
    assert outs[-1].finished and outs[-1].usage.cached_tokens == 64  # 4 blocks of the shared 70 tokens
    # the hit adopted only what its first computed token (at 64) sees: blocks 0 and 1 are the null block
    assert table[:2] == [NULL_BLOCK] * 2 and NULL_BLOCK not in table[2:] and len(table) == 5
    both = engine.generate(prompts, greedy(24))  # together, both from the cache
    assert [o.new_token_ids for o in both] == expected
    assert [o.usage.cached_tokens for o in both] == [64, 64]
    assert bm.num_free_blocks == bm.capacity
    bm.check_invariants([])


@pytest.mark.parametrize("caching", [False, True])
def test_preemption_under_a_small_budget_gives_transformers_tokens(tiny_mistral, caching):
    loaded, hf = tiny_mistral
    prompts = [random_prompt(30 + 7 * i, seed=30 + i) for i in range(4)]
    # 8 blocks of 16 (7 usable): each sequence holds 3 when decoding, 5 while its prompt comes in chunks of 20
    engine = window_engine(loaded, num_kv_blocks=8, enable_prefix_caching=caching)
    tokens, most = run_watching_blocks(engine, prompts, steps=48)
    assert engine.scheduler.num_preemptions > 0
    assert tokens == [hf_greedy(hf, p, 48) for p in prompts]
    assert most == WINDOW // 16 + 2


def test_one_sequence_longer_than_the_budget_runs(tiny_mistral):
    """6 blocks of 16 (5 usable, 80 tokens) run a 230-token sequence (15 blocks) of a windowed model."""
    loaded, hf = tiny_mistral
    prompt = random_prompt(30, seed=40)
    engine = window_engine(loaded, num_kv_blocks=6)
    tokens, most = run_watching_blocks(engine, [prompt], steps=200)
    assert tokens == [hf_greedy(hf, prompt, 200)] and most == 3


def test_a_model_with_a_global_layer_frees_nothing(tmp_path, smollm_tokenizer):
    from tests.engine.test_gemma3 import hf_gemma3

    loaded, _ = loaded_with_tokenizer(hf_gemma3(seed=5), tmp_path, smollm_tokenizer)  # window 8, one global layer
    assert loaded.config.sliding_window and loaded.config.kv_window == 0
    engine = window_engine(loaded, block_size=4)
    bm = engine.block_manager
    assert bm.window == 0 and bm.capacity == bm.num_blocks == 64  # no null block either
    engine.add_request("g", random_prompt(30, seed=41), greedy(30))
    most = 0
    while engine.has_unfinished():
        engine.step()
        for seq in engine.scheduler.running:
            assert len(seq.block_table) == -(-seq.num_computed_tokens // 4)  # every block kept, all real
            most = max(most, len(seq.block_table))
        bm.check_invariants(list(engine.scheduler.requests.values()))
    assert most == 15
    with pytest.raises(PromptTooLongError, match="more KV cache"):  # 80 tokens in 20 blocks of 4: not 60 + 40
        window_engine(loaded, block_size=4, num_kv_blocks=20).add_request("long", random_prompt(60), greedy(40))
