"""benchmarks/workloads.py: the prompts of engine_offline.py's --workload (issue 40)."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from inference.engine.tokenizer import load_tokenizer

# Loaded by path under a name of its own: putting benchmarks/ on sys.path would let its scripts (kernels.py,
# serving.py) shadow the project's packages for the rest of the session.
_SPEC = importlib.util.spec_from_file_location(
    "bench_workloads", Path(__file__).resolve().parents[2] / "benchmarks" / "workloads.py")
workloads = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(workloads)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("smollm2-135m-instruct")


def _args(workload: str, **kw) -> SimpleNamespace:
    defaults = dict(workload=workload, seed=0, requests=5, prefill_requests=2, prompt_min=8, prompt_max=16,
                    single_prompt_len=12)
    return SimpleNamespace(**defaults | kw)


def test_random_prompts_are_drawn_as_before():
    rng = random.Random(0)  # the values of engine_offline.random_prompts before --workload existed
    assert workloads.random_prompts(rng, 2, 3, 5, 49152, {0, 1, 2}) == [[27762, 2853, 17168, 33706],
                                                                       [26737, 20077, 31434, 23665]]
    assert workloads.random_prompts(rng, 1, 4, 4, 49152, set()) == [[33275, 9327, 18670, 9358]]


def test_random_phases_draw_prefill_single_main_in_turn():
    args, vocab, banned = _args("random"), 1000, {3}
    phases = workloads.phase_prompts(args, None, random.Random(7), vocab, banned)
    rng = random.Random(7)
    assert phases == {"prefill": workloads.random_prompts(rng, 2, 16, 16, vocab, banned),
                      "single": workloads.random_prompts(rng, 1, 12, 12, vocab, banned),
                      "main": workloads.random_prompts(rng, 5, 8, 16, vocab, banned)}
    with pytest.raises(ValueError):
        workloads.workload_prompts("random", None, 1, 0)


def test_extractive_passages_are_about_500_tokens_and_in_their_prompts(tokenizer):
    requests = workloads.extractive_messages(tokenizer, 12, seed=0)
    prompts = workloads.workload_prompts("extractive", tokenizer, 12, seed=0)
    for (passage, messages), ids in zip(requests, prompts):
        assert 425 <= len(tokenizer.encode(passage)) <= 575
        assert passage in messages[0]["content"]
        assert passage in tokenizer.decode(ids, skip_special_tokens=False)
    assert len({tuple(p) for p in prompts}) == len(prompts)  # every request differs
    assert len({m[0]["content"].split(":", 1)[0] for _, m in requests}) > 2  # instructions rotate
    kinds = {kind for kind, _ in workloads._passage_pool(tokenizer, workloads.PASSAGE_TOKENS)}
    assert kinds == {"code", "prose"}


def test_extractive_prompts_are_deterministic_for_a_seed(tokenizer):
    first = workloads.workload_prompts("extractive", tokenizer, 6, seed=3)
    assert workloads.workload_prompts("extractive", tokenizer, 6, seed=3) == first
    assert workloads.workload_prompts("extractive", tokenizer, 3, seed=3, start=3) == first[3:]
    assert workloads.workload_prompts("extractive", tokenizer, 6, seed=4) != first


def test_chat_prompts_render_through_the_chat_template(tokenizer):
    n = len(workloads.CHAT_QUESTIONS) * len(workloads.CHAT_SYSTEMS)
    prompts = workloads.workload_prompts("chat", tokenizer, n, seed=1)
    assert len({tuple(p) for p in prompts}) == n
    for messages, ids in zip(workloads.chat_messages(n, seed=1), prompts):
        assert ids == tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True))
        text = tokenizer.decode(ids, skip_special_tokens=False)
        assert messages[-1]["content"] in text and text.endswith("<|im_start|>assistant\n")
    assert workloads.workload_prompts("chat", tokenizer, 4, seed=1) == prompts[:4]


def test_workload_phases_and_hf_batches_use_the_same_ids(tokenizer):
    args = _args("chat", requests=3, prefill_requests=2)
    phases = workloads.phase_prompts(args, tokenizer, random.Random(0), 0, set())
    every = workloads.workload_prompts("chat", tokenizer, 6, seed=0)
    assert phases == {"prefill": every[:2], "single": every[2:3], "main": every[3:6]}
    fixed = {"single": phases["single"][0], "batch": phases["main"]}
    ids, mask = workloads.hf_batch(args, None, 4, 0, fixed)
    width = max(map(len, phases["main"]))
    for row, m, prompt in zip(ids, mask, workloads.cycled(phases["main"], 4)):
        assert len(row) == len(m) == width and row[width - len(prompt):] == prompt and sum(m) == len(prompt)
    assert workloads.hf_batch(args, None, 1, 0, fixed) == ([fixed["single"]], [[1] * len(fixed["single"])])
