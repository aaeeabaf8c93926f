"""Structured outputs through the engine's machinery: async scheduling (a grammar row's sampling waits for the
step in flight to land), preemption by recompute (the matcher is kept), the compile gate (off the engine's
thread, cached, bounded in time, abortable) and the wire form."""

from __future__ import annotations

import threading

import pytest

from inference.engine import EngineValidationError, SamplingParams
from inference.engine.structured_spec import StructuredOutput
from tests.engine.test_engine_async_output import run_steps, summary
from tests.engine.test_structured import assert_valid, constrained, prompt_for

pytestmark = pytest.mark.slow


def _uncached(result: dict) -> dict:
    """A request's tokens, text and counts, but not its prefix-cache hits: a request whose grammar compiles
    while another's runs may find that one's prompt blocks cached (when depends on the compile's thread)."""
    usage = {key: value for key, value in result["usage"].items() if key != "cached_tokens"}
    return {**result, "usage": usage}


def mixed(tokenizer, chat_prompts):
    return [
        ("plain", chat_prompts[0], SamplingParams(temperature=0.0, max_tokens=20)),
        ("order", prompt_for(tokenizer, "order"), constrained("order", temperature=0.0, max_tokens=200)),
        ("seeded", chat_prompts[2], SamplingParams(temperature=0.9, seed=5, max_tokens=20)),
        ("weather", prompt_for(tokenizer, "weather"), constrained("weather", temperature=0.8, seed=2,
                                                                  max_tokens=200)),
        ("cut", prompt_for(tokenizer, "person"), constrained("person", temperature=0.0, max_tokens=5)),
        ("quiz", prompt_for(tokenizer, "quiz"), constrained("quiz", temperature=0.0, max_tokens=200,
                                                            logprobs=1)),  # a host row too
    ]


@pytest.mark.parametrize("late", [{"async_scheduling": True}, {"async_output": True}],
                         ids=["async_scheduling", "async_output"])
def test_async_modes_match_the_synchronous_engine(make_engine, tokenizer, chat_prompts, late):
    requests = mixed(tokenizer, chat_prompts)
    sync, _ = run_steps(make_engine(async_scheduling=False, async_output=False), requests)
    engine = make_engine(**late)
    # a grammar row must not be sampled while a step launched before is not read back (its matcher would
    # not have taken that step's token yet)
    launched, read_back, stale = [], set(), []
    launch, finish = engine.sampler.launch, engine.sampler.finish

    def checked_launch(logits, seqs):
        if any(s.grammar is not None for s in seqs) and any(id(p) not in read_back for p in launched):
            stale.append([s.request_id for s in seqs])
        launched.append(launch(logits, seqs))
        return launched[-1]

    def checked_finish(pending):
        read_back.add(id(pending))
        return finish(pending)

    engine.sampler.launch, engine.sampler.finish = checked_launch, checked_finish
    ahead, _ = run_steps(engine, requests)
    assert not stale and len(read_back) == len(launched)
    for rid, _, _ in requests:
        assert _uncached(summary(ahead[rid])) == _uncached(summary(sync[rid])), rid
    for rid in ("order", "weather", "quiz"):
        assert summary(sync[rid])["finish_reason"] == "stop"
        assert_valid(rid, summary(sync[rid])["text"])
    assert summary(sync["cut"])["finish_reason"] == "length"
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    engine.block_manager.check_invariants([])


@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async_scheduling"])
def test_preemption_keeps_the_matcher(make_engine, tokenizer, async_scheduling):
    names = ["person", "sentiment", "weather", "quiz", "book", "address"]  # 13-70 tokens each
    prompts = [prompt_for(tokenizer, n) for n in names]
    params = [constrained(n, temperature=0.0, max_tokens=120) for n in names]
    reference = make_engine().generate(prompts, params)
    engine = make_engine(num_kv_blocks=16, max_num_batched_tokens=128, async_scheduling=async_scheduling)
    outs = engine.generate(prompts, params)
    assert engine.scheduler.num_preemptions > 0
    for name, out, ref in zip(names, outs, reference):
        assert out.new_token_ids == ref.new_token_ids and out.finish_reason == "stop", name
        assert_valid(name, out.delta_text)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_compiles_wait_off_the_engine_thread_and_are_cached(make_engine, tokenizer, chat_prompts):
    engine = make_engine()
    gate = engine.structured
    release = threading.Event()
    real = gate.compiler._compile
    gate.compiler._compile = lambda spec: release.wait(30) and real(spec)
    engine.add_request("json", prompt_for(tokenizer, "person"), constrained("person", temperature=0.0,
                                                                             max_tokens=100))
    engine.add_request("plain", chat_prompts[0], SamplingParams(temperature=0.0, max_tokens=8))
    assert "json" in gate.waiting and "json" not in engine.scheduler.requests
    finished = {}
    for _ in range(30):  # the plain request runs to its end while the grammar is not ready
        finished.update({o.request_id: o for o in engine.step() if o.finished})
        if "plain" in finished:
            break
    assert "plain" in finished and "json" in gate.waiting
    release.set()
    while engine.has_unfinished():
        finished.update({o.request_id: o for o in engine.step() if o.finished})
    assert finished["json"].finish_reason == "stop"
    engine.add_request("again", prompt_for(tokenizer, "person"), constrained("person", temperature=0.0,
                                                                              max_tokens=100))
    assert "again" in engine.scheduler.requests and not gate.waiting  # a cache hit: scheduled at once
    with pytest.raises(ValueError, match="duplicate"):
        engine.add_request("again", prompt_for(tokenizer, "person"), constrained("person"))


def test_the_compile_time_bound_and_aborts(make_engine, tokenizer):
    engine = make_engine()
    gate = engine.structured
    gate.timeout_s = 0.05
    release = threading.Event()
    real = gate.compiler._compile
    gate.compiler._compile = lambda spec: release.wait(30) and real(spec)
    engine.add_request("slow", prompt_for(tokenizer, "book"), constrained("book"))
    engine.add_request("gone", prompt_for(tokenizer, "movie"), constrained("movie"))
    assert engine.abort("gone")
    outs = []
    while engine.has_unfinished():
        outs += engine.step()
    by_id = {o.request_id: o for o in outs}
    assert by_id["gone"].finish_reason == "abort"
    assert by_id["slow"].finish_reason == "error" and "did not compile within" in by_id["slow"].error
    release.set()


def test_the_cache_is_a_bounded_lru(make_engine):
    engine = make_engine()
    compiler = engine.structured.compiler
    compiler.cache_size = 2
    specs = [StructuredOutput("json_schema", {"type": "object", "properties": {f"k{i}": {"type": "integer"}}})
             .validate() for i in range(3)]
    first = compiler.submit(specs[0])
    compiler.submit(specs[1]).result()
    assert compiler.submit(specs[0]) is first  # a hit, now the most recent
    compiler.submit(specs[2]).result()
    assert list(compiler._cache) == [specs[0].key, specs[2].key]


def test_the_wire_form_round_trips():
    sp = SamplingParams(max_tokens=5, structured_output=StructuredOutput("json_schema", {"type": "object"}, True))
    wire = sp.to_dict()
    assert wire["structured_output"] == {"kind": "json_schema", "schema": {"type": "object"}, "strict": True}
    back = SamplingParams.from_dict(wire).validate()
    assert back.structured_output == sp.structured_output
    assert SamplingParams.from_dict(SamplingParams().to_dict()).structured_output is None
