"""Speculative decoding (n-gram prompt lookup) on the real model, float32: the greedy tokens are those of the
engine without it, with chunked prefill, prefix-cache hits, stop strings, logprobs and preemption; refused
drafts roll back cleanly (block-manager invariants after every step); the usage counts emitted tokens only."""

from pathlib import Path

import pytest

from inference.engine import SamplingParams

pytestmark = pytest.mark.slow

SOURCE = (Path(__file__).resolve().parents[2] / "inference" / "engine" / "block_manager.py").read_text()[:1400]
N_TOKENS = 64


@pytest.fixture(scope="module")
def prompts(tokenizer, chat_prompts):
    """A copy task (drafts are kept often), a rewrite, and two open chat questions (drafts are rare)."""
    copy = tokenizer.encode_chat([{"role": "user", "content": "Repeat this code exactly:\n\n" + SOURCE}])
    rewrite = tokenizer.encode_chat([{"role": "user", "content": "Add comments to this code:\n\n" + SOURCE[:700]}])
    return [copy, rewrite, chat_prompts[0], chat_prompts[6]]


def _run(engine, prompts, sampling, check=None) -> dict:
    for i, p in enumerate(prompts):
        engine.add_request(f"r{i}", p, sampling)
    outs = {f"r{i}": [] for i in range(len(prompts))}
    while engine.has_unfinished():
        for out in engine.step():
            outs[out.request_id].append(out)
        if check is not None:
            check(engine)
    return outs


def _tokens(outs) -> dict:
    return {rid: [t for o in seq for t in o.new_token_ids] for rid, seq in outs.items()}


def _text(outs) -> dict:
    return {rid: "".join(o.delta_text for o in seq) for rid, seq in outs.items()}


@pytest.fixture(scope="module")
def plain(make_engine, prompts):
    engine = make_engine(max_num_batched_tokens=128)
    return _run(engine, prompts, SamplingParams(temperature=0.0, max_tokens=N_TOKENS, logprobs=2))


def test_greedy_tokens_are_the_same_with_chunked_prefill_and_a_prefix_cache_hit(make_engine, prompts, plain):
    engine = make_engine(max_num_batched_tokens=128, speculative="ngram")  # the copy prompt takes 4 chunks
    sampling = SamplingParams(temperature=0.0, max_tokens=N_TOKENS, logprobs=2)
    spec = _run(engine, prompts, sampling)
    assert _tokens(spec) == _tokens(plain)
    assert _text(spec) == _text(plain)
    counters = engine.counters
    assert counters["spec_decode_num_accepted_tokens"] >= N_TOKENS // 4  # the copy task keeps many drafts
    assert counters["spec_decode_num_drafts"] < counters["generated_tokens"]
    assert counters["generated_tokens"] == sum(map(len, _tokens(spec).values()))  # emitted tokens only
    assert any(len(o.new_token_ids) > 1 for o in spec["r0"])  # several tokens in one step
    for rid, seq in spec.items():  # usage counts the emitted tokens
        assert seq[-1].finished and seq[-1].usage.completion_tokens == len(_tokens(spec)[rid])
        lps = [lp for o in seq for lp in o.logprobs]
        want = [lp for o in plain[rid] for lp in o.logprobs]
        assert [lp["token"] for lp in lps] == [lp["token"] for lp in want]
        assert [[t["token"] for t in lp["top_logprobs"]] for lp in lps] == [
            [t["token"] for t in lp["top_logprobs"]] for lp in want]
        assert max(abs(a["logprob"] - b["logprob"]) for a, b in zip(lps, want)) < 1e-3
    again = _run(engine, prompts[:1], sampling)  # the copy prompt again: served from the prefix cache
    assert again["r0"][-1].usage.cached_tokens > 0
    assert _tokens(again)["r0"] == _tokens(plain)["r0"]


def test_a_stop_string_inside_a_run_of_kept_drafts_ends_there(make_engine, prompts, plain):
    text = _text(plain)["r0"]
    stop = text[len(text) // 2:len(text) // 2 + 6]  # from the middle of the copied code
    cut = text[:text.index(stop)]
    sampling = SamplingParams(temperature=0.0, max_tokens=N_TOKENS, stop=[stop])
    for mode in ("off", "ngram"):
        out = _run(make_engine(speculative=mode), prompts[:1], sampling)["r0"]
        assert "".join(o.delta_text for o in out) == cut, mode
        assert out[-1].finish_reason == "stop" and out[-1].stop_reason == stop
        if mode == "off":
            want_tokens = _tokens({"r0": out})["r0"]
        else:
            assert _tokens({"r0": out})["r0"] == want_tokens
            assert out[-1].usage.completion_tokens == len(want_tokens)


def test_rollbacks_and_preemption_keep_the_block_manager_consistent(make_engine, prompts, plain):
    """A KV cache too small for the four requests at once: preemptions, with drafts refused and rolled back."""
    engine = make_engine(num_kv_blocks=36, max_num_batched_tokens=128, speculative="ngram")

    def check(engine):
        live = list(engine.scheduler.requests.values())
        engine.block_manager.check_invariants(live)
        for seq in live:
            assert not seq.spec_tokens  # drafts live for one step only
            assert seq.num_computed_tokens <= max(seq.num_tokens - 1, 0)

    spec = _run(engine, prompts, SamplingParams(temperature=0.0, max_tokens=N_TOKENS, logprobs=2), check)
    assert engine.scheduler.num_preemptions > 0
    assert engine.counters["spec_decode_num_accepted_tokens"] < engine.counters["spec_decode_num_draft_tokens"]
    assert _tokens(spec) == _tokens(plain)


def test_sampled_requests_run_to_their_length_and_bill_what_they_emit(make_engine, prompts):
    engine = make_engine(speculative="ngram")
    sampling = SamplingParams(temperature=0.7, top_p=0.9, max_tokens=N_TOKENS, seed=5, ignore_eos=True)
    outs = _run(engine, prompts[:2], sampling)
    for seq in outs.values():
        assert seq[-1].finish_reason == "length"
        assert seq[-1].usage.completion_tokens == len([t for o in seq for t in o.new_token_ids]) == N_TOKENS
    assert engine.counters["spec_decode_num_accepted_tokens"] > 0
    again = _run(make_engine(speculative="ngram"), prompts[:2], sampling)
    assert _tokens(again) == _tokens(outs)  # a seed repeats itself with speculation too


def test_deferred_outputs_give_the_same_tokens(make_engine, prompts, plain):
    """async_output: a step's runs are emitted during the next step."""
    engine = make_engine(max_num_batched_tokens=128, speculative="ngram", async_output=True)
    spec = _run(engine, prompts, SamplingParams(temperature=0.0, max_tokens=N_TOKENS, logprobs=2))
    assert _tokens(spec) == _tokens(plain)
    assert engine.counters["spec_decode_num_accepted_tokens"] > 0


def test_a_failed_step_is_rerun_without_its_drafts():
    from inference.engine.scheduler import ScheduledBatch
    from inference.engine.sequence import Sequence
    from inference.engine.spec_step import drafting, drop_drafts

    a = Sequence("a", [1, 2, 3], SamplingParams(max_tokens=8), max_tokens=8)
    b = Sequence("b", [1, 2, 3], SamplingParams(max_tokens=8), max_tokens=8)
    a.spec_tokens = [4, 5]
    batch = ScheduledBatch([a, b], [3, 1])
    assert drafting(batch)
    drop_drafts(batch)
    assert batch.num_new_tokens == [1, 1] and not a.spec_tokens and not drafting(batch)
