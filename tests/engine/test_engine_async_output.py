"""async_output (on CUDA with async scheduling off): a step's outputs are built while the next step runs.

On the CPU nothing overlaps, but the bookkeeping is the same, so these tests force it on and
hold it to the synchronous engine: the same tokens, text, finish and stop reasons, usage and
logprobs for every request, each delta arriving one step later, late stop strings dropping the
token computed meanwhile (never emitted, never counted), aborts as the last word.
"""

from __future__ import annotations

import pytest

from inference.engine import SamplingParams

pytestmark = pytest.mark.slow


def run_steps(engine, requests):
    """Add (id, prompt, params) requests, step to the end; per request: the list of its outputs, and the
    number of step() calls made."""
    for rid, prompt, sp in requests:
        engine.add_request(rid, prompt, sp)
    seen: dict[str, list] = {rid: [] for rid, _, _ in requests}
    calls = 0
    while engine.has_unfinished():
        calls += 1
        for out in engine.step():
            assert not (seen[out.request_id] and seen[out.request_id][-1].finished), "output after the final one"
            seen[out.request_id].append(out)
    return seen, calls


def summary(outputs):
    final = outputs[-1]
    return {
        "tokens": [t for o in outputs for t in o.new_token_ids],
        "text": "".join(o.delta_text for o in outputs),
        "finish_reason": final.finish_reason,
        "stop_reason": final.stop_reason,
        "usage": final.usage.to_dict(),
        "finished": final.finished,
        "logprobs": [(lp["token"], round(lp["logprob"], 4)) for o in outputs for lp in (o.logprobs or [])],
    }


def mixed_requests(chat_prompts):
    return [
        ("greedy", chat_prompts[0], SamplingParams(temperature=0.0, max_tokens=24)),
        ("stop-string", chat_prompts[1], SamplingParams(temperature=0.0, max_tokens=40, stop=[" the", "\n"])),
        ("seeded", chat_prompts[2], SamplingParams(temperature=0.9, top_p=0.9, seed=5, max_tokens=20)),
        ("logprobs", chat_prompts[3], SamplingParams(temperature=0.0, max_tokens=12, logprobs=2)),
        ("short", chat_prompts[4], SamplingParams(temperature=0.0, max_tokens=1)),
        ("eos", chat_prompts[0], SamplingParams(temperature=0.0, max_tokens=200)),  # stops on EOS
        ("penalties", chat_prompts[5], SamplingParams(temperature=0.0, max_tokens=16, frequency_penalty=1.0,
                                                      min_tokens=4)),
    ]


def test_async_output_matches_the_synchronous_engine(make_engine, chat_prompts):
    requests = mixed_requests(chat_prompts)
    sync_engine = make_engine(async_output=False)
    async_engine = make_engine(async_output=True)
    assert not sync_engine.async_output and async_engine.async_output
    sync, sync_calls = run_steps(sync_engine, requests)
    late, late_calls = run_steps(async_engine, requests)
    for rid, _, _ in requests:
        assert summary(late[rid]) == summary(sync[rid]), rid
        assert late[rid][-1].finished
    assert late_calls == sync_calls + 1  # the last outputs come with one more call
    stopped = summary(sync["stop-string"])
    assert stopped["finish_reason"] == "stop" and stopped["stop_reason"] in (" the", "\n")
    assert summary(sync["eos"])["finish_reason"] == "stop"
    # everything freed, nothing left behind
    for engine in (sync_engine, async_engine):
        assert not engine.has_unfinished()
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


@pytest.mark.parametrize("late", [{"async_output": True}, {"async_scheduling": True}],
                         ids=["async_output", "async_scheduling"])
def test_each_delta_arrives_one_step_later(make_engine, chat_prompts, late):
    sp = SamplingParams(temperature=0.0, max_tokens=6)
    sync_engine, async_engine = make_engine(async_output=False), make_engine(**late)
    for engine in (sync_engine, async_engine):
        engine.add_request("r", chat_prompts[6], sp)
    sync_steps = [[o.new_token_ids for o in sync_engine.step()] for _ in range(6)]
    async_steps = [[o.new_token_ids for o in async_engine.step()] for _ in range(7)]
    assert async_steps[0] == [] and async_steps[1:] == sync_steps
    assert not async_engine.has_unfinished()


def test_a_late_stop_string_drops_the_token_computed_meanwhile(make_engine, chat_prompts):
    # find where the greedy text first shows a space-led word, and stop on it
    probe = make_engine(async_output=False).generate([chat_prompts[1]], SamplingParams(temperature=0.0,
                                                                                     max_tokens=30))[0]
    words = probe.delta_text.split()
    stop = " " + words[2]
    sp = SamplingParams(temperature=0.0, max_tokens=30, stop=[stop])
    engine = make_engine(async_output=True)
    outs, _ = run_steps(engine, [("r", chat_prompts[1], sp)])
    got = summary(outs["r"])
    expected = summary(run_steps(make_engine(async_output=False), [("r", chat_prompts[1], sp)])[0]["r"])
    assert got == expected
    assert got["finish_reason"] == "stop" and got["stop_reason"] == stop and stop not in got["text"]
    assert got["usage"]["completion_tokens"] == len(got["tokens"])  # the dropped token is not counted
    assert engine.counters["generated_tokens"] == len(got["tokens"]) + 1  # ...though it was computed


@pytest.mark.parametrize("late", [{"async_output": True}, {"async_scheduling": True}],
                         ids=["async_output", "async_scheduling"])
def test_abort_is_the_last_word(make_engine, chat_prompts, late):
    engine = make_engine(**late)
    engine.add_request("a", chat_prompts[0], SamplingParams(temperature=0.0, max_tokens=50))
    engine.add_request("b", chat_prompts[2], SamplingParams(temperature=0.0, max_tokens=8))
    seen: dict[str, list] = {"a": [], "b": []}
    for _ in range(4):
        for out in engine.step():
            seen[out.request_id].append(out)
    if engine.async_scheduling:
        assert engine.scheduler.requests["a"].pending == 1  # aborted with a token in flight
    assert engine.abort("a")
    while engine.has_unfinished():
        for out in engine.step():
            seen[out.request_id].append(out)
    last = seen["a"][-1]
    assert last.finished and last.finish_reason == "abort"
    assert sum(o.finished for o in seen["a"]) == 1
    emitted = sum(len(o.new_token_ids) for o in seen["a"])
    if engine.async_scheduling:  # the token in flight at the abort is never read back, so never billed
        assert last.usage.completion_tokens == emitted == 3
    else:  # async_output: a token taken but not yet emitted at the abort is billed, not sent
        assert last.usage.completion_tokens >= emitted
    assert seen["b"][-1].finish_reason == "length" and len([t for o in seen["b"] for t in o.new_token_ids]) == 8
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks  # cached blocks left behind count as free (evictable)
