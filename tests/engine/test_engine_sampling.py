"""Sampling on the real model: seeds, stop strings and tokens, EOS and lengths,
penalties, logit bias and logprobs, checked against HF float32 logits."""

import math

import pytest
import torch

from inference.engine import SamplingParams

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(make_engine):
    return make_engine()


def run_stream(engine, prompt, sp, rid="s"):
    """Drive one request through step(); return (final output, list of deltas)."""
    engine.add_request(rid, prompt, sp)
    deltas, tokens, last = [], [], None
    while engine.has_unfinished():
        for out in engine.step():
            deltas.append(out.delta_text)
            tokens += out.new_token_ids
            last = out
    last.new_token_ids = tokens
    return last, deltas


def test_seeded_sampling_is_reproducible_and_batch_independent(engine, chat_prompts):
    sp = SamplingParams(temperature=1.0, top_p=0.95, seed=1234, max_tokens=24)
    alone = engine.generate([chat_prompts[1]], sp)[0].new_token_ids
    assert engine.generate([chat_prompts[1]], sp)[0].new_token_ids == alone
    others = [SamplingParams(temperature=1.0, max_tokens=30)] * 5
    batch = engine.generate([chat_prompts[i] for i in (0, 2, 3, 1, 4, 5)], others[:3] + [sp] + others[3:])
    assert batch[3].new_token_ids == alone
    other_seed = SamplingParams(temperature=1.0, top_p=0.95, seed=99, max_tokens=24)
    assert engine.generate([chat_prompts[1]], other_seed)[0].new_token_ids != alone


def test_stop_string_is_never_emitted_and_ends_the_text(engine, tokenizer, chat_prompts):
    prompt = tokenizer.encode_chat([{"role": "user", "content": "Count from 1 to 20, one number per line."}])
    full = engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=60))[0].delta_text
    stop = "5\n6"
    assert stop in full
    out, deltas = run_stream(engine, prompt, SamplingParams(temperature=0.0, max_tokens=60, stop=[stop, "zzz"]))
    assert out.finish_reason == "stop" and out.stop_reason == stop
    # The deltas add up to the text before the stop string: no delta ever carried any part of
    # it, although "5" arrived in an earlier step than "\n6" (it was held back, then dropped).
    assert "".join(deltas) == full[: full.index(stop)]
    assert len([d for d in deltas if d]) > 3


def test_stop_token_ids_eos_and_lengths(engine, tokenizer, chat_prompts):
    prompt = chat_prompts[0]  # "What is the capital of France?" ends with EOS well before 40 tokens
    natural = engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=40))[0]
    assert natural.finish_reason == "stop" and natural.stop_reason is None
    assert natural.new_token_ids[-1] == tokenizer.eos_token_id
    assert natural.delta_text == tokenizer.decode(natural.new_token_ids)
    n = len(natural.new_token_ids)
    stop_id = natural.new_token_ids[2]
    out = engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=40, stop_token_ids=[stop_id]))[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop_id
    assert out.new_token_ids == natural.new_token_ids[:3]
    assert out.delta_text == tokenizer.decode(natural.new_token_ids[:2])  # the stop token's text is not emitted
    capped = engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=3))[0]
    assert capped.finish_reason == "length" and capped.usage.completion_tokens == 3
    longer = engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=40, min_tokens=n + 5))[0]
    assert len(longer.new_token_ids) >= n + 5 and longer.new_token_ids[: n - 1] == natural.new_token_ids[:-1]
    ignoring = engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=n + 4, ignore_eos=True))[0]
    assert ignoring.finish_reason == "length" and len(ignoring.new_token_ids) == n + 4


def _expected_greedy(logits_row, output_so_far, prompt, sp):
    row = logits_row.clone()
    counts = torch.bincount(torch.tensor(output_so_far, dtype=torch.long), minlength=row.shape[0]).float() \
        if output_so_far else torch.zeros_like(row)
    if sp.repetition_penalty != 1.0:
        seen = counts > 0
        seen[torch.tensor(prompt)] = True
        row = torch.where(seen, torch.where(row > 0, row / sp.repetition_penalty, row * sp.repetition_penalty), row)
    row -= counts * sp.frequency_penalty + (counts > 0).float() * sp.presence_penalty
    return row


@pytest.mark.parametrize("kwargs", [
    {"frequency_penalty": 1.5},
    {"presence_penalty": 1.8},
    {"repetition_penalty": 1.4},
])
def test_penalties_follow_the_definition(engine, tokenizer, hf_logits, kwargs):
    # Plain greedy decoding of this prompt falls into a loop ("A flame of light, a flame of light, ...").
    prompt = tokenizer.encode_chat([{"role": "user", "content": "Write a haiku about 雪 and 🙂"}])
    sp = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, **kwargs)
    out = engine.generate([prompt], sp)[0].new_token_ids
    logits = hf_logits(prompt, out)
    changed = 0
    for i, token in enumerate(out):  # each token is the argmax of the penalised HF logits
        row = _expected_greedy(logits[i], out[:i], prompt, sp)
        best = int(row.argmax())
        assert token == best or row[best] - row[token] < 1e-3, (i, token, best)
        changed += int(logits[i].argmax()) != token
    assert changed > 0  # the penalty really overrode the model's own choice somewhere


def test_logit_bias_forces_a_token(engine, tokenizer, chat_prompts):
    target = tokenizer.encode(" banana")[0]
    out = engine.generate([chat_prompts[0]], SamplingParams(temperature=0.0, max_tokens=4,
                                                            logit_bias={target: 100.0}))[0]
    assert out.new_token_ids == [target] * 4


def test_logprobs_match_log_softmax_and_top_sums_at_most_one(engine, chat_prompts, hf_logits):
    prompt = chat_prompts[4]
    sp = SamplingParams(temperature=0.8, seed=7, max_tokens=12, logprobs=5)
    out = engine.generate([prompt], sp)[0]
    assert len(out.logprobs) == len(out.new_token_ids) == 12
    ref = torch.log_softmax(hf_logits(prompt, out.new_token_ids), dim=-1)
    for i, (token, entry) in enumerate(zip(out.new_token_ids, out.logprobs)):
        assert entry["token_id"] == token
        assert entry["logprob"] == pytest.approx(ref[i, token].item(), abs=2e-3)
        top = entry["top_logprobs"]
        assert len(top) == 5
        values = [t["logprob"] for t in top]
        assert values == sorted(values, reverse=True)
        assert sum(math.exp(v) for v in values) <= 1.0 + 1e-5
        assert top[0]["logprob"] >= entry["logprob"] - 1e-6
        assert top[0]["token_id"] == int(ref[i].argmax()) or abs(values[0] - values[1]) < 1e-3
        for t in (entry, *top):
            assert bytes(t["bytes"]) == bytes(t["bytes"])  # list of ints
            assert t["token"].startswith("bytes:") or bytes(t["bytes"]).decode("utf-8") == t["token"]
    greedy = engine.generate([prompt], SamplingParams(temperature=0.0, max_tokens=4, logprobs=0))[0]
    assert all(e["top_logprobs"] == [] for e in greedy.logprobs)
