"""async_scheduling (the CUDA default, `EngineConfig.async_scheduling`): the next step is scheduled and
launched before the tokens of the step in flight are read back; a decoding sequence's input is
then its pending token, copied on the device from that step's sampled ids.

On the CPU nothing overlaps, but the bookkeeping is the same, so these tests force it on and hold
it to the synchronous engine: the same tokens, text, finish and stop reasons, usage and logprobs
for every request, under preemption and prefix caching too; a request that stops on a token or a
stop string has had one wasted step launched for it, whose token is never emitted or billed; one
that ends on its length limit has none; the block manager's books balance after every step. Each
delta one step later and aborts as the last word: test_engine_async_output.py, in both modes.
"""

from __future__ import annotations

import pytest
import torch

from inference.engine import SamplingParams
from tests.engine.test_engine_async_output import mixed_requests, run_steps, summary

pytestmark = pytest.mark.slow


def plain_requests(chat_prompts):
    """Rows that never read their history on the host, so every step is launched ahead."""
    return [
        ("greedy", chat_prompts[0], SamplingParams(temperature=0.0, max_tokens=24)),
        ("stop-string", chat_prompts[1], SamplingParams(temperature=0.0, max_tokens=40, stop=[" the", "\n"])),
        ("seeded", chat_prompts[2], SamplingParams(temperature=0.9, top_p=0.9, seed=5, max_tokens=20)),
        ("short", chat_prompts[4], SamplingParams(temperature=0.0, max_tokens=1)),
        ("eos", chat_prompts[0], SamplingParams(temperature=0.0, max_tokens=200)),
        ("min-tokens", chat_prompts[3], SamplingParams(temperature=0.0, max_tokens=30, min_tokens=12)),
        ("bias", chat_prompts[5], SamplingParams(temperature=0.0, max_tokens=10, logit_bias={30: 5.0})),
    ]


@pytest.mark.parametrize("requests", [plain_requests, mixed_requests], ids=["launched-ahead", "with-host-rows"])
def test_async_scheduling_matches_the_synchronous_engine(make_engine, chat_prompts, requests):
    requests = requests(chat_prompts)
    sync_engine = make_engine(async_scheduling=False, async_output=False)
    ahead = make_engine(async_scheduling=True)
    assert ahead.async_scheduling and not sync_engine.async_scheduling
    sync, sync_calls = run_steps(sync_engine, requests)
    late, late_calls = run_steps(ahead, requests)
    for rid, _, _ in requests:
        assert summary(late[rid]) == summary(sync[rid]), rid
    assert late_calls == sync_calls + 1  # the last outputs come with one more call
    assert summary(sync["eos"])["finish_reason"] == "stop"
    for engine in (sync_engine, ahead):
        assert not engine.has_unfinished()
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
        engine.block_manager.check_invariants([])


def test_decode_inputs_come_from_the_step_in_flight(make_engine, chat_prompts):
    engine = make_engine(async_scheduling=True)
    engine.add_request("r", chat_prompts[6], SamplingParams(temperature=0.0, max_tokens=8))
    engine.step()  # prefill, launched: its token is pending
    seq = engine.scheduler.requests["r"]
    assert seq.pending == 1 and seq.output_token_ids == []
    assert seq.num_computed_tokens == seq.num_tokens  # the prompt's K/V; the token is not known yet
    outs = engine.step()  # launches the first decode step, then reads the prefill's token back
    assert [o.new_token_ids for o in outs] == [[seq.output_token_ids[0]]]
    assert seq.pending == 1 and seq.num_computed_tokens == seq.num_tokens  # the first token's K/V too


def test_wasted_steps_only_for_requests_that_stop_early(make_engine, chat_prompts):
    probe = make_engine(async_scheduling=False).generate([chat_prompts[1]], SamplingParams(temperature=0.0,
                                                                                          max_tokens=30))[0]
    stop = " " + probe.delta_text.split()[2]
    cases = {
        "length": SamplingParams(temperature=0.0, max_tokens=9),
        "stop-string": SamplingParams(temperature=0.0, max_tokens=30, stop=[stop]),
        "stop-token": SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=[probe.new_token_ids[4]]),
    }
    for name, sp in cases.items():
        engine = make_engine(async_scheduling=True)
        outs, _ = run_steps(engine, [("r", chat_prompts[1], sp)])
        got = summary(outs["r"])
        expected = summary(run_steps(make_engine(async_scheduling=False), [("r", chat_prompts[1], sp)])[0]["r"])
        assert got == expected, name
        assert got["usage"]["completion_tokens"] == len(got["tokens"])  # a dropped token is not billed
        # a length limit is known when the last step is scheduled; a stop is found one step late
        wasted = 0 if name == "length" else 1
        assert engine.counters["generated_tokens"] == len(got["tokens"]) + wasted, name
    stop_token = probe.new_token_ids[4]
    assert expected["stop_reason"] == stop_token
    assert expected["usage"]["completion_tokens"] == probe.new_token_ids.index(stop_token) + 1


@pytest.mark.parametrize("caching", [False, True])
def test_preemption_keeps_outputs_and_the_books_balance(make_engine, chat_prompts, caching):
    g = SamplingParams(temperature=0.0, max_tokens=40, min_tokens=40)
    reference = [o.new_token_ids for o in make_engine(enable_prefix_caching=False).generate(chat_prompts[:8], g)]
    engine = make_engine(num_kv_blocks=16, enable_prefix_caching=caching, max_num_batched_tokens=128,
                         async_scheduling=True)
    for i, prompt in enumerate(chat_prompts[:8]):
        engine.add_request(f"r{i}", prompt, g)
    tokens: dict[str, list[int]] = {f"r{i}": [] for i in range(8)}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
        engine.block_manager.check_invariants(list(engine.scheduler.requests.values()))
    assert engine.scheduler.num_preemptions > 0
    assert [tokens[f"r{i}"] for i in range(8)] == reference
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_prefix_cache_registers_blocks_completed_by_a_pending_token(make_engine, chat_prompts):
    """A block filled by generated tokens is registered once its last token is read back, under the
    same hash as the synchronous engine's: a second request whose prompt is the first one's prompt
    and output hits it."""
    sp = SamplingParams(temperature=0.0, max_tokens=40, min_tokens=40)
    runs = {}
    for mode in (False, True):
        engine = make_engine(async_scheduling=mode)
        first = engine.generate([chat_prompts[2]], sp)[0]
        follow = engine.generate([chat_prompts[2] + first.new_token_ids + [30]], sp)[0]
        runs[mode] = (first.new_token_ids, follow.new_token_ids, follow.usage.cached_tokens)
        engine.block_manager.check_invariants([])
    assert runs[True] == runs[False]
    bs = 16
    assert runs[True][2] == (len(chat_prompts[2]) + 40) // bs * bs  # every full block, generated ones too


def test_first_tokens_are_announced_once(make_engine, chat_prompts):
    engine = make_engine(async_scheduling=True)
    for i in range(3):
        engine.add_request(f"r{i}", chat_prompts[i], SamplingParams(temperature=0.0, max_tokens=5))
    announced: list[str] = []
    while engine.has_unfinished():
        engine.step(on_first_tokens=announced.extend)
    assert sorted(announced) == ["r0", "r1", "r2"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: overlapping the GPU is the point")
def test_async_scheduling_on_cuda_matches_the_synchronous_engine(tmp_path):
    """The real overlap: pinned asynchronous input copies, decode inputs copied from the step in flight,
    CUDA-graph replays, token read-back by event. A SmolLM2-shaped model with random weights (a bare GPU
    host has no GGUF), float32, 24 requests with mixed lengths, stop tokens and a seeded draw, and again
    under a KV budget small enough to preempt: the same tokens as the synchronous engine."""
    import random
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from gpu_engine import SHAPES, write_checkpoint

    from inference.engine import Engine, EngineConfig

    write_checkpoint(SHAPES["smollm2-135m"], tmp_path, seed=0)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 49152) for _ in range(rng.randrange(20, 300))] for _ in range(24)]
    params = [SamplingParams(temperature=0.0, max_tokens=rng.randrange(8, 64), ignore_eos=True) for _ in prompts]
    params[5] = SamplingParams(temperature=0.8, seed=11, max_tokens=40, ignore_eos=True)

    def run(ahead: bool, stops=None, **config) -> list:
        engine = Engine(EngineConfig(model=str(tmp_path), device="cuda", dtype="float32", max_num_seqs=32,
                                     max_num_batched_tokens=2048, enable_prefix_caching=True,
                                     async_scheduling=ahead, async_output=ahead, **config))
        assert engine.async_scheduling is ahead
        sps = [p if stops is None or i not in stops else
               SamplingParams(temperature=0.0, max_tokens=p.max_tokens, stop_token_ids=[stops[i]])
               for i, p in enumerate(params)]
        outs = engine.generate(prompts, sps)
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
        return [(o.new_token_ids, o.finish_reason) for o in outs]

    plain = run(False, kv_cache_mb=256)
    # stop on the 4th token of some greedy requests: those finish one step before their batch-mates
    stops = {i: plain[i][0][3] for i in (0, 7, 13, 20)}
    for config in ({"kv_cache_mb": 256}, {"num_kv_blocks": 96}):
        reference = run(False, stops, **config)
        assert run(True, stops, **config) == reference, config
        assert all(reference[i][1] == "stop" for i in stops)
