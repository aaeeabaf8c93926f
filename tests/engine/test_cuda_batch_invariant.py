"""Batch-invariant mode on CUDA at engine level (inference.engine.invariant_mode): the same tokens, and the
same logprobs, for 12 seeded requests alone, beside 32 others with every prompt split into chunks, and
after a prefix-cache hit; the GPU's kernel set (Triton fixed matmul, row attention), bfloat16, a
SmolLM2-shaped model with random weights (a bare GPU host has no GGUF). The CPU's version of this test
runs the real SmolLM2: tests/engine/test_batch_invariant.py."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import torch

from inference.engine import Engine, EngineConfig
from tests.engine.invariance_cases import other_requests, target_sampling
from tests.engine.test_batch_invariant import run

pytestmark = [pytest.mark.slow, pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CHUNK = 24


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from gpu_engine import SHAPES, write_checkpoint

    path = tmp_path_factory.mktemp("invariant-ckpt")
    write_checkpoint(SHAPES["smollm2-135m"], path, seed=0)
    return path


def test_cuda_same_tokens_alone_in_a_chunked_batch_and_after_a_prefix_hit(checkpoint):
    rng = random.Random(5)
    system = [rng.randrange(3, 49152) for _ in range(40)]
    prompts = [system + [rng.randrange(3, 49152) for _ in range(rng.randrange(10, 20))] for _ in range(12)]
    targets = [(f"t{i}", prompt, target_sampling(i)) for i, prompt in enumerate(prompts)]

    def engine(**overrides) -> Engine:
        config = dict(model=str(checkpoint), device="cuda", dtype="bfloat16", kv_cache_mb=256, max_num_seqs=48,
                      max_num_batched_tokens=512, batch_invariant=True)
        config.update(overrides)
        built = Engine(EngineConfig(**config))
        assert built.runner.graph_runner is None and built.runner.prefill_runner is None
        return built

    solo = engine(enable_prefix_caching=False)
    alone: dict[str, list] = {}
    for request in targets:
        alone.update(run(solo, [request])[0])
    assert any(isinstance(t, str) for t in alone["t1"])  # logprobs are part of what is compared
    assert len({tuple(t) for t in alone.values()}) > 1

    chunked = engine(enable_prefix_caching=False, max_num_batched_tokens=CHUNK + 24)
    others = [(f"o{j}", prompt, sampling) for j, (prompt, sampling) in enumerate(other_requests(49152))]
    mixed = list(others)
    for i, request in enumerate(targets):
        mixed.insert(1 + 3 * i, request)
    batch, facts = run(chunked, mixed)
    assert facts["shared_steps"] >= 5  # the targets really shared steps with others
    for i in range(len(prompts)):
        assert batch[f"t{i}"] == alone[f"t{i}"], f"target {i} in a chunked batch"

    cached_engine = engine(enable_prefix_caching=True)
    run(cached_engine, [("warm", system + [7, 8, 9], {"max_tokens": 1})])
    cached, facts = run(cached_engine, targets)
    for i in range(len(prompts)):
        assert facts["cached"][f"t{i}"] >= 32, f"target {i} was not served from the prefix cache"
        assert cached[f"t{i}"] == alone[f"t{i}"], f"target {i} after a prefix-cache hit"
