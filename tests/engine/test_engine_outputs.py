"""Engine API behaviour: streaming deltas, usage and timing, validation, stats."""

import pytest

from inference.engine import EngineValidationError, PromptTooLongError, RequestOutput, SamplingParams

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(make_engine):
    return make_engine(max_model_len=512)


def test_streamed_deltas_concatenate_to_the_decode_without_leaking_the_prompt(engine, tokenizer, chat_prompts):
    prompt = chat_prompts[2]  # Chinese: multi-byte characters split across tokens
    engine.add_request("cjk", prompt, SamplingParams(temperature=0.0, max_tokens=30))
    outs: list[RequestOutput] = []
    while engine.has_unfinished():
        outs += engine.step()
    tokens = [t for o in outs for t in o.new_token_ids]
    text = "".join(o.delta_text for o in outs)
    assert text == tokenizer.decode(tokens)
    assert not any("\ufffd" in o.delta_text for o in outs)
    first_text = next(o.delta_text for o in outs if o.delta_text)
    assert "assistant" not in first_text and "<|im_start|>" not in first_text
    last = outs[-1]
    assert last.finished and sum(not o.finished for o in outs) == len(outs) - 1
    assert last.usage.prompt_tokens == len(prompt) and last.usage.completion_tokens == len(tokens)
    t = last.timing
    assert 0 <= t.queued_s <= t.ttft_s <= t.e2e_s


@pytest.mark.parametrize("prompt_len,sp,param,too_long", [
    (0, SamplingParams(), "prompt", False),
    (500, SamplingParams(max_tokens=20), "prompt", True),
    (10, SamplingParams(top_p=0.0), "top_p", False),
    (10, SamplingParams(max_tokens=-1), "max_tokens", False),
])
def test_add_request_validation(engine, prompt_len, sp, param, too_long):
    """The engine names the parameter at fault in its own (completions) terms; a prompt that does not
    fit is a PromptTooLongError, which the API maps to "messages" for chat."""
    with pytest.raises(EngineValidationError) as err:
        engine.add_request("bad", [5] * prompt_len, sp)
    assert err.value.param == param
    assert isinstance(err.value, PromptTooLongError) is too_long
    assert not engine.has_unfinished()


def test_max_tokens_none_runs_to_the_context_limit(make_engine, chat_prompts):
    engine = make_engine(max_model_len=64)
    out = engine.generate([chat_prompts[0]], SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True))[0]
    assert out.finish_reason == "length"
    assert len(chat_prompts[0]) + out.usage.completion_tokens == 64


def test_abort_reports_once_and_stats(engine, chat_prompts):
    engine.add_request("x", chat_prompts[1], SamplingParams(temperature=0.0, max_tokens=50))
    engine.step()
    assert engine.stats()["running"] == 1 and engine.stats()["kv_usage"] > 0
    assert engine.abort("x")
    outs = engine.step()
    assert [(o.request_id, o.finished, o.finish_reason) for o in outs] == [("x", True, "abort")]
    assert outs[0].usage.completion_tokens == 1
    assert not engine.has_unfinished() and engine.step() == []
    stats = engine.stats()
    assert stats["running"] == 0 and stats["waiting"] == 0 and stats["kv_usage"] == 0.0
    for key in ("prefix_cache_hit_rate", "generation_tok_s", "prompt_tok_s", "preemptions", "steps"):
        assert key in stats


def test_on_first_tokens_names_the_requests_sampling_their_first_token_before_the_model_runs(make_engine, chat_prompts):
    """A prompt prefilled in chunks is named at the step that finishes it; decodes never are."""
    engine = make_engine(max_num_batched_tokens=64, max_num_seqs=4)
    order: list[object] = []
    run = engine.runner.run

    def running(*args, **kwargs):
        order.append("model")
        return run(*args, **kwargs)

    engine.runner.run = running
    long_prompt = (chat_prompts[0] * 8)[:150]  # three chunks of at most 64 tokens
    engine.add_request("short", chat_prompts[1], SamplingParams(max_tokens=3, temperature=0.0))
    engine.add_request("long", long_prompt, SamplingParams(max_tokens=3, temperature=0.0))
    named: list[list[str]] = []
    firsts_seen: list[set[str]] = []
    while engine.has_unfinished():
        order.append("step")
        outputs = engine.step(on_first_tokens=lambda ids: (named.append(ids), order.append(tuple(ids))))
        firsts_seen.append({o.request_id for o in outputs if o.new_token_ids and o.usage.completion_tokens == 1})
    flat = [rid for ids in named for rid in ids]
    assert sorted(flat) == ["long", "short"]  # each named once
    for ids in named:  # each call came after its step began and before that step's model run
        at = order.index(tuple(ids))
        assert order[at - 1] == "step" and order[at + 1] == "model"
    # named at the very step whose outputs carry that request's first token
    steps_named = {rid: i for i, ids in enumerate(_per_step(order)) for rid in ids}
    steps_first = {rid: i for i, rids in enumerate(firsts_seen) for rid in rids}
    assert steps_named == steps_first and steps_first["long"] > steps_first["short"]


def _per_step(order: list) -> list[list[str]]:
    steps: list[list[str]] = []
    for item in order:
        if item == "step":
            steps.append([])
        elif isinstance(item, tuple):
            steps[-1].extend(item)
    return steps
