"""Batch-invariant mode on the real model (inference.engine.invariant_mode): 12 seeded requests,
greedy and at temperature 0.8, give token-for-token the same output alone, in a batch of 32 other
requests of mixed lengths with chunked prefill splitting every prompt, and after a prefix-cache hit on
their shared system prompt; in bfloat16 and in float32."""

from __future__ import annotations

import pytest
import torch

from inference.engine import Engine, EngineConfig, SamplingParams
from inference.engine.loader import load_model
from tests.engine.invariance_cases import QUESTIONS, SYSTEM, other_requests, target_sampling

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
CHUNK = 24  # the chunked engine's token budget: every target prompt (~50 tokens) takes 3 chunks


@pytest.fixture(scope="module", params=["bfloat16", "float32"])
def loaded(request, smollm_fp32):
    if request.param == "float32":
        return smollm_fp32
    return load_model(MODEL, dtype=torch.bfloat16, device="cpu")


@pytest.fixture(scope="module")
def prompts(loaded):
    tok = loaded.tokenizer
    return [tok.encode_chat([{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]) for q in QUESTIONS]


def engine_for(loaded, **overrides) -> Engine:
    dtype = "bfloat16" if loaded.dtype == torch.bfloat16 else "float32"
    config = dict(model=MODEL, device="cpu", dtype=dtype, kv_cache_mb=64, max_num_seqs=48,
                  max_num_batched_tokens=512, batch_invariant=True)
    config.update(overrides)
    return Engine(EngineConfig(**config), loaded=loaded)


def run(engine: Engine, requests: list[tuple[str, list[int], dict]]) -> tuple[dict[str, list], dict]:
    """Run `requests` (id, prompt, sampling fields) to the end -> (tokens, and the repr of each token's
    logprobs when asked, by id; facts about the steps)."""
    for request_id, prompt, sampling in requests:
        engine.add_request(request_id, prompt, SamplingParams(**sampling))
    tokens: dict[str, list[int]] = {}
    facts = {"cached": {}, "shared_steps": 0}
    while engine.has_unfinished():
        outputs = engine.step()
        ids = {o.request_id for o in outputs if o.new_token_ids}
        if any(i.startswith("t") for i in ids) and sum(i.startswith("o") for i in ids) >= 2:
            facts["shared_steps"] += 1  # a target sampled in a step where two others did too
        for out in outputs:
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.logprobs:  # compared exactly with the tokens: the chosen token's and the top 5's
                tokens[out.request_id].extend(repr(entry) for entry in out.logprobs)
            if out.finished:
                facts["cached"][out.request_id] = out.usage.cached_tokens
    return tokens, facts


def targets(prompts) -> list[tuple[str, list[int], dict]]:
    return [(f"t{i}", prompt, target_sampling(i)) for i, prompt in enumerate(prompts)]


def test_same_tokens_alone_in_a_chunked_batch_and_after_a_prefix_hit(loaded, prompts):
    assert all(len(p) > 2 * CHUNK for p in prompts)
    # alone: one request at a time, each prompt prefilled whole, nothing cached
    engine = engine_for(loaded, enable_prefix_caching=False)
    alone: dict[str, list[int]] = {}
    for request in targets(prompts):
        alone.update(run(engine, [request])[0])
    assert all(len([t for t in alone[f"t{i}"] if isinstance(t, int)]) == 8 for i in range(len(prompts)))
    assert any(isinstance(t, str) for t in alone["t1"])  # logprobs are part of what is compared
    assert len({tuple(t) for t in alone.values()}) > 1

    # beside 32 other requests of mixed lengths, every prompt split into chunks of CHUNK tokens
    engine = engine_for(loaded, enable_prefix_caching=False, max_num_batched_tokens=CHUNK + 24)
    others = [(f"o{j}", prompt, sampling) for j, (prompt, sampling) in
              enumerate(other_requests(loaded.config.vocab_size))]
    mixed = list(others)
    for i, request in enumerate(targets(prompts)):
        mixed.insert(1 + 3 * i, request)
    batch, facts = run(engine, mixed)
    assert facts["shared_steps"] >= 5  # the targets really shared steps with others
    for i in range(len(prompts)):
        assert batch[f"t{i}"] == alone[f"t{i}"], f"target {i} in a chunked batch"

    # after a prefix-cache hit on the system prompt (a first request cached its blocks)
    engine = engine_for(loaded, enable_prefix_caching=True)
    run(engine, [("warm", prompts[0][:-2] + [28, 29], {"max_tokens": 1})])
    cached, facts = run(engine, targets(prompts))
    for i in range(len(prompts)):
        assert facts["cached"][f"t{i}"] >= 32, f"target {i} was not served from the prefix cache"
        assert cached[f"t{i}"] == alone[f"t{i}"], f"target {i} after a prefix-cache hit"


def test_fingerprint_names_the_mode_and_the_dtype(loaded, smollm_fp32):
    invariant = engine_for(loaded, num_kv_blocks=8)
    plain = engine_for(loaded, num_kv_blocks=8, batch_invariant=False)
    assert invariant.system_fingerprint.startswith("fp_") and len(invariant.system_fingerprint) == 15
    assert invariant.system_fingerprint != plain.system_fingerprint
    assert invariant.stats()["system_fingerprint"] == invariant.system_fingerprint
    assert engine_for(loaded, num_kv_blocks=8).system_fingerprint == invariant.system_fingerprint
    if loaded is not smollm_fp32:
        other_dtype = Engine(EngineConfig(model=MODEL, dtype="float32", num_kv_blocks=8, batch_invariant=True),
                             loaded=smollm_fp32)
        assert other_dtype.system_fingerprint != invariant.system_fingerprint
