"""Structured outputs (issue 38, the engine): the grammar's token mask and what it makes the model write.

The mask the sampler applies equals llguidance's own matcher's allowed set (its logit-bias path, not the
bitmask path the engine uses), rows without a grammar are left bit for bit; the real SmolLM2 (float32),
greedy and sampled, writes documents that parse and validate for 10 schemas; a small max_tokens cuts one
with "length"; unconstrained requests beside constrained ones get the same tokens as without them.
"""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from inference.engine import SamplingParams
from inference.engine.structured import GrammarCompiler, GrammarState
from inference.engine.structured_mask import GrammarMasker
from inference.engine.structured_spec import StructuredOutput
from tests.engine.structured_schemas import BOUNDED, TYPICAL

pytestmark = pytest.mark.slow


def spec(name: str, strict: bool = True) -> StructuredOutput:
    schema = TYPICAL[name][0]
    return StructuredOutput("json_object") if schema is None else StructuredOutput("json_schema", schema, strict)


def constrained(name: str, **sampling) -> SamplingParams:
    return SamplingParams(structured_output=spec(name), **sampling)


def prompt_for(tokenizer, name: str) -> list[int]:
    return tokenizer.encode_chat([{"role": "user", "content": f"Write a {name.replace('_', ' ')} as JSON."}])


def assert_valid(name: str, text: str) -> None:
    doc = json.loads(text)
    schema = TYPICAL[name][0]
    if schema is None:
        assert isinstance(doc, dict)
    else:
        jsonschema.validate(doc, schema, format_checker=jsonschema.FormatChecker())


@pytest.fixture(scope="module")
def compiler(tokenizer, engine_model_f32):
    compiler = GrammarCompiler(tokenizer, engine_model_f32.config.vocab_size)
    yield compiler
    compiler.close()


class Row:
    """What the masker reads of a sequence."""

    def __init__(self, grammar) -> None:
        self.grammar = grammar


def test_the_mask_is_the_library_matchers_allowed_set(compiler, tokenizer):
    template = compiler.submit(spec("order").validate()).result()
    prefixes = ['', '{"id": 1', '{"id": 12, "items": [{"sku": "A', '{"id": 12, "items": [{"sku": "A", "qty": 3, ',
                '{"id": 1, "items": [{"sku": "", "qty": 1, "price": 2}], "status": "p',
                '{"id": 1, "items": [{"sku": "", "qty": 1, "price": 2}], "status": "paid"}']
    rows = []
    for text in prefixes:
        matcher = template.deep_copy()
        assert matcher.consume_tokens(tokenizer.encode(text)), text
        rows.append(Row(GrammarState(matcher)))
    vocab = len(tokenizer.token_bytes_table())
    plain = torch.randn(2, vocab)
    logits = torch.cat([torch.zeros(len(rows), vocab), plain])
    masker = GrammarMasker(tokenizer.eos_token_id)
    masker.apply(logits, rows + [Row(None), Row(None)], list(range(len(rows))))
    for row, text, got in zip(rows, prefixes, logits):
        expected = torch.frombuffer(bytearray(row.grammar.matcher.compute_logit_bias()), dtype=torch.uint8) > 0
        assert torch.equal(torch.isfinite(got), expected[:vocab]), text
        assert bool(expected.any())
    assert torch.equal(logits[len(rows):], plain)  # rows without a grammar: untouched, bit for bit
    eos = tokenizer.eos_token_id
    assert not torch.isfinite(logits[0, eos]) and torch.isfinite(logits[-3, eos])  # EOS once complete only
    assert torch.isfinite(logits[-3]).sum() == 1
    specials = [i for i in tokenizer.all_special_ids if i != eos]
    assert not torch.isfinite(logits[2, specials]).any()  # no <|im_start|> inside a string


def test_a_subset_of_rows_is_masked_and_an_error_row_gets_eos_alone(compiler, tokenizer):
    template = compiler.submit(spec("person").validate()).result()
    broken = template.deep_copy()
    assert not broken.consume_token(tokenizer.encode("x")[0])  # outside the grammar: the matcher is in error
    rows = [Row(None), Row(GrammarState(broken)), Row(None), Row(GrammarState(template.deep_copy()))]
    logits = torch.randn(4, len(tokenizer.token_bytes_table()))
    before = logits.clone()
    GrammarMasker(tokenizer.eos_token_id).apply(logits, rows, [1, 3])
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[2], before[2])
    assert torch.isfinite(logits[1]).nonzero().flatten().tolist() == [tokenizer.eos_token_id]
    assert 0 < int(torch.isfinite(logits[3]).sum()) < 10  # '{' and '{"' spellings


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_outputs_parse_and_validate_for_ten_schemas(make_engine, tokenizer, temperature):
    engine = make_engine(max_num_batched_tokens=1024)
    prompts = [prompt_for(tokenizer, name) for name in BOUNDED]
    params = [constrained(name, temperature=temperature, top_p=0.95, seed=7 + i, max_tokens=400)
              for i, name in enumerate(BOUNDED)]
    outs = engine.generate(prompts, params)
    for name, out in zip(BOUNDED, outs):
        assert out.finish_reason == "stop", (name, out.delta_text)
        assert_valid(name, out.delta_text)
        assert out.new_token_ids[-1] != tokenizer.eos_token_id  # ended by the grammar, not by a sampled EOS
        assert out.usage.completion_tokens == len(out.new_token_ids)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_json_object_is_an_object_and_a_small_max_tokens_is_length(make_engine, tokenizer):
    engine = make_engine()
    p = prompt_for(tokenizer, "person")
    short, obj = engine.generate([p, p], [constrained("order", temperature=0.0, max_tokens=6),
                                          constrained("json_object", temperature=0.0, max_tokens=300,
                                                      frequency_penalty=0.5)])
    assert short.finish_reason == "length" and len(short.new_token_ids) == 6
    assert short.delta_text.startswith('{"id": ')
    if obj.finish_reason == "stop":
        assert isinstance(json.loads(obj.delta_text), dict)
    else:
        assert obj.finish_reason == "length" and obj.delta_text.startswith("{")


def test_the_grammar_ends_a_request_whatever_eos_and_min_tokens_say(make_engine, tokenizer):
    engine = make_engine()
    p = prompt_for(tokenizer, "sentiment")
    outs = engine.generate([p, p], [constrained("sentiment", temperature=0.0, max_tokens=200, ignore_eos=True),
                                    constrained("sentiment", temperature=0.0, max_tokens=200, min_tokens=150)])
    for out in outs:
        assert out.finish_reason == "stop" and len(out.new_token_ids) < 150
        assert_valid("sentiment", out.delta_text)
    assert outs[0].new_token_ids == outs[1].new_token_ids


def test_unconstrained_requests_beside_constrained_ones_are_unchanged(make_engine, tokenizer, chat_prompts):
    plain = [SamplingParams(temperature=0.0, max_tokens=24), SamplingParams(temperature=0.8, seed=3, max_tokens=24),
             SamplingParams(temperature=1.0, top_k=40, seed=11, max_tokens=24, logprobs=2)]
    alone = make_engine(batch_invariant=True).generate(chat_prompts[:3], plain)
    mixed_prompts = [chat_prompts[0], prompt_for(tokenizer, "book"), chat_prompts[1],
                     prompt_for(tokenizer, "weather"), chat_prompts[2]]
    mixed_params = [plain[0], constrained("book", temperature=0.0, max_tokens=100), plain[1],
                    constrained("weather", temperature=0.7, seed=1, max_tokens=100), plain[2]]
    mixed = make_engine(batch_invariant=True).generate(mixed_prompts, mixed_params)
    for a, b in zip(alone, [mixed[0], mixed[2], mixed[4]]):
        assert b.new_token_ids == a.new_token_ids and b.delta_text == a.delta_text
        assert b.logprobs == a.logprobs
    assert_valid("book", mixed[1].delta_text)
    assert_valid("weather", mixed[3].delta_text)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_mask_on_cuda_equals_the_cpu_mask(compiler, tokenizer):
    template = compiler.submit(spec("event").validate()).result()
    rows = []
    for text in ['', '{"title": "Standup", "date": "2025-', '{"title": "x", "date": "2025-01-31", "attendees": [']:
        matcher = template.deep_copy()
        assert matcher.consume_tokens(tokenizer.encode(text))
        rows.append(Row(GrammarState(matcher)))
    rows.insert(1, Row(None))
    vocab = len(tokenizer.token_bytes_table())
    cpu = torch.randn(len(rows), vocab)
    gpu = cpu.cuda()
    masker = GrammarMasker(tokenizer.eos_token_id)
    masker.apply(cpu, rows, [0, 2, 3])
    masker.apply(gpu, rows, [0, 2, 3])
    assert torch.equal(gpu.cpu(), cpu)
