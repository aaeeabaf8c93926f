"""Automatic prefix caching on the real model: same outputs on hit and miss,
cached_tokens equal to the block-aligned shared prefix, salts isolate tenants."""

import pytest

from inference.engine import SamplingParams

pytestmark = pytest.mark.slow

G = SamplingParams(temperature=0.0, max_tokens=12)
SYSTEM = (
    "You are a meticulous assistant for a travel agency. Always answer politely, mention the "
    "best season to visit, give one practical tip about local transport, and keep answers short. "
    "Never invent prices. If you do not know, say so. 回答可以包含中文。 🙂"
)


def chat(tokenizer, question):
    return tokenizer.encode_chat([{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])


def shared_prefix(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


@pytest.fixture(scope="module")
def prompts(tokenizer):
    p1, p2 = chat(tokenizer, "Should I visit Kyoto?"), chat(tokenizer, "Tell me about Lisbon in spring.")
    assert shared_prefix(p1, p2) > 48
    return p1, p2


@pytest.fixture(scope="module")
def reference(make_engine, prompts):
    engine = make_engine(enable_prefix_caching=False)
    return [engine.generate([p], G)[0].new_token_ids for p in prompts]


def test_hit_and_miss_give_identical_outputs_and_block_aligned_cached_tokens(make_engine, prompts, reference):
    p1, p2 = prompts
    engine = make_engine()
    first = engine.generate([p1], G)[0]
    assert first.usage.cached_tokens == 0 and first.new_token_ids == reference[0]
    second = engine.generate([p2], G)[0]
    expected = shared_prefix(p1, p2) // 16 * 16
    assert second.usage.cached_tokens == expected > 0
    assert second.usage.prompt_tokens == len(p2)
    assert second.new_token_ids == reference[1]
    again = engine.generate([p1], G)[0]  # the whole prompt is cached; its last token is recomputed
    assert again.usage.cached_tokens == (len(p1) - 1) // 16 * 16
    assert again.new_token_ids == reference[0]
    stats = engine.stats()
    assert stats["prefix_cache_hits"] == expected + again.usage.cached_tokens
    assert 0 < stats["prefix_cache_hit_rate"] < 1


def test_different_cache_salt_gets_no_hit(make_engine, prompts, reference):
    p1, p2 = prompts
    engine = make_engine()
    engine.generate([p1], G, cache_salt="tenant-a")
    other = engine.generate([p2], G, cache_salt="tenant-b")[0]
    assert other.usage.cached_tokens == 0 and other.new_token_ids == reference[1]
    unsalted = engine.generate([p2], G)[0]
    assert unsalted.usage.cached_tokens == 0
    same = engine.generate([p2], G, cache_salt="tenant-a")[0]
    assert same.usage.cached_tokens == shared_prefix(p1, p2) // 16 * 16
    assert same.new_token_ids == reference[1]


def test_hit_on_blocks_still_used_by_a_running_request(make_engine, prompts, reference):
    p1, p2 = prompts
    engine = make_engine()
    engine.add_request("a", p1, SamplingParams(temperature=0.0, max_tokens=12))
    tokens = {"a": [], "b": []}
    cached = {}
    for out in engine.step():  # a's prefill: its full blocks are in the cache from now on
        tokens[out.request_id] += out.new_token_ids
    engine.add_request("b", p2, G)
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
            cached[out.request_id] = out.usage.cached_tokens
    assert cached["b"] == shared_prefix(p1, p2) // 16 * 16
    assert tokens["a"] == reference[0] and tokens["b"] == reference[1]
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    engine.block_manager.check_invariants([])
