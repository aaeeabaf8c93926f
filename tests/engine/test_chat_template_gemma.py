"""Gemma 3's chat template (inference/chat_templates/gemma3.jinja, the one Google ships with the gemma-3 -it
checkpoints) on the real Gemma 3 270M GGUF: our sandboxed renderer against transformers' apply_chat_template
(text and token ids), its system-prompt folding, its refusal of non-alternating roles as our ChatTemplateError;
the end-of-turn token a chat stops on, found from the template; and the engine, greedy, stopping there.

The real file comes from tests/gemma_package.py: skipped where the package is missing, a failure under CI."""

from __future__ import annotations

from pathlib import Path

import jinja2
import pytest

from inference.engine.chat_template import ChatTemplateError, assistant_turn_end, render_chat_template
from tests.gemma_package import gemma3_gguf_path

GEMMA3_TEMPLATE = (Path(__file__).resolve().parents[2] / "inference" / "chat_templates" / "gemma3.jinja").read_text()
END_OF_TURN = 106  # `<end_of_turn>` in Gemma 3's vocabulary

SYSTEM_USER_ASSISTANT_USER = [
    {"role": "system", "content": "You answer with one word."},
    {"role": "user", "content": "What colour is the sky?"},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "What colour is grass?"},
]
CONVERSATIONS = [
    SYSTEM_USER_ASSISTANT_USER,
    SYSTEM_USER_ASSISTANT_USER[1:],  # no system message
    [{"role": "user", "content": "  Bonjour 😀\n\n"}],  # content is trimmed
    [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "你好"}],
    [{"role": "user", "content": [{"type": "text", "text": "parts, "}, {"type": "text", "text": " joined"}]}],
]


@pytest.fixture(scope="module")
def gemma_path():
    return gemma3_gguf_path()


@pytest.fixture(scope="module")
def gemma_tokenizer(gemma_path):
    from inference.engine.tokenizer import load_tokenizer

    return load_tokenizer(str(gemma_path))


@pytest.fixture(scope="module")
def hf_gemma_tokenizer(gemma_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(gemma_path.parent), gguf_file=gemma_path.name)


def _ours(tokenizer, messages, add_generation_prompt=True) -> str:
    return render_chat_template(GEMMA3_TEMPLATE, messages, add_generation_prompt=add_generation_prompt,
                                bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token)


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_gemma_template_renders_as_transformers(messages, add_generation_prompt, gemma_tokenizer,
                                                hf_gemma_tokenizer):
    ours = _ours(gemma_tokenizer, messages, add_generation_prompt)
    theirs = hf_gemma_tokenizer.apply_chat_template(messages, chat_template=GEMMA3_TEMPLATE, tokenize=False,
                                                    add_generation_prompt=add_generation_prompt)
    assert ours == theirs
    ids = hf_gemma_tokenizer.apply_chat_template(messages, chat_template=GEMMA3_TEMPLATE, tokenize=True,
                                                 return_dict=False, add_generation_prompt=add_generation_prompt)
    assert gemma_tokenizer.encode(ours) == list(ids)
    assert ids[0] == gemma_tokenizer.bos_token_id and ids.count(gemma_tokenizer.bos_token_id) == 1


def test_gemma_folds_the_system_prompt_into_the_first_user_turn(gemma_tokenizer):
    assert _ours(gemma_tokenizer, SYSTEM_USER_ASSISTANT_USER) == (
        "<bos><start_of_turn>user\nYou answer with one word.\n\nWhat colour is the sky?<end_of_turn>\n"
        "<start_of_turn>model\nBlue.<end_of_turn>\n"
        "<start_of_turn>user\nWhat colour is grass?<end_of_turn>\n"
        "<start_of_turn>model\n")
    assert _ours(gemma_tokenizer, SYSTEM_USER_ASSISTANT_USER[1:2], add_generation_prompt=False) == (
        "<bos><start_of_turn>user\nWhat colour is the sky?<end_of_turn>\n")


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    [{"role": "assistant", "content": "a"}],
    [{"role": "system", "content": "s"}, {"role": "assistant", "content": "a"}],
])
def test_non_alternating_roles_are_a_chat_template_error(messages, gemma_tokenizer, hf_gemma_tokenizer):
    with pytest.raises(ChatTemplateError, match="Conversation roles must alternate user/assistant"):
        _ours(gemma_tokenizer, messages)
    with pytest.raises(jinja2.TemplateError, match="Conversation roles must alternate"):  # transformers agrees
        hf_gemma_tokenizer.apply_chat_template(messages, chat_template=GEMMA3_TEMPLATE, tokenize=False)


def test_end_of_turn_from_the_template(gemma_tokenizer, smollm_tokenizer):
    assert assistant_turn_end(GEMMA3_TEMPLATE, bos_token="<bos>") == "<end_of_turn>\n"
    assert gemma_tokenizer.id_to_token(END_OF_TURN) == "<end_of_turn>"
    assert gemma_tokenizer.end_of_turn_ids(GEMMA3_TEMPLATE) == (END_OF_TURN,)
    assert gemma_tokenizer.end_of_turn_ids() == ()  # the base model's files have no template
    # SmolLM2 (ChatML): its turn ends with <|im_end|>, which is its EOS already: nothing to add
    assert assistant_turn_end(smollm_tokenizer.chat_template) == "<|im_end|>\n"
    assert smollm_tokenizer.end_of_turn_ids() == ()
    assert smollm_tokenizer.eos_token == "<|im_end|>"
    # a turn ending in plain text (a newline) never becomes a stop token
    assert gemma_tokenizer.end_of_turn_ids("{% for m in messages %}{{ m['content'] }}\n{% endfor %}") == ()
    # a template that cannot render a reply still names its end-of-turn token
    refusing = "{% if messages[-1]['role'] != 'user' %}{{ raise_exception('no') }}{% endif %}x<end_of_turn>"
    assert assistant_turn_end(refusing) is None
    assert gemma_tokenizer.end_of_turn_ids(refusing) == (END_OF_TURN,)


@pytest.mark.slow
def test_a_greedy_gemma_chat_stops_at_end_of_turn(gemma_path, gemma_tokenizer):
    """The base model has never learnt to write `<end_of_turn>` (its control tokens are untrained: greedy, it
    writes " mendatang" or "iatrics" where the turn ends), so a logit bias raises the token just enough to win
    where the reply ends and nowhere before: then the engine stops there and the text leaves it out."""
    from inference.engine import Engine, EngineConfig
    from inference.engine.sampling_params import SamplingParams

    engine = Engine(EngineConfig(model=str(gemma_path), device="cpu", dtype="float32", kv_cache_mb=64,
                                 max_num_seqs=4, max_num_batched_tokens=256))
    prompt = gemma_tokenizer.encode(_ours(gemma_tokenizer, SYSTEM_USER_ASSISTANT_USER))
    stops = list(gemma_tokenizer.end_of_turn_ids(GEMMA3_TEMPLATE))
    chat = SamplingParams(max_tokens=16, temperature=0.0, logit_bias={END_OF_TURN: 12.0}, stop_token_ids=stops)
    plain = SamplingParams(max_tokens=16, temperature=0.0, logit_bias={END_OF_TURN: 12.0},
                           skip_special_tokens=False)
    stopped, unstopped = engine.generate([prompt, prompt], [chat, plain])
    assert (stopped.finish_reason, stopped.delta_text) == ("stop", "Green.")
    assert stopped.new_token_ids[-1] == END_OF_TURN and END_OF_TURN not in stopped.new_token_ids[:-1]
    assert stopped.usage.completion_tokens == len(stopped.new_token_ids)
    # without the stop the same greedy run writes the token and goes on into a made-up next turn
    assert unstopped.new_token_ids[:len(stopped.new_token_ids)] == stopped.new_token_ids
    assert unstopped.finish_reason == "length" and unstopped.delta_text.startswith("Green.<end_of_turn>")
