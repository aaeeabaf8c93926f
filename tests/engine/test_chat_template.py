"""The GGUF's chat template rendered by our sandboxed Jinja2 environment, against transformers'
apply_chat_template on the same GGUF; and the sandbox holding against hostile templates."""

import pytest

from inference.engine.chat_template import ChatTemplateError, render_chat_template

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are a pirate."}, {"role": "user", "content": "Where is the treasure?"}],
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."},
     {"role": "user", "content": "And 3+3?"}],
    [{"role": "system", "content": "Answer in French."}, {"role": "user", "content": "Bonjour 😀"},
     {"role": "assistant", "content": "Salut ! Ça va ?"}, {"role": "user", "content": "你好，请说中文。"}],
    [{"role": "user", "content": "  spaces\n\nand\ttabs  "}],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_render_equals_transformers(messages, add_generation_prompt, smollm_tokenizer, hf_smollm_tokenizer):
    ours = smollm_tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    theirs = hf_smollm_tokenizer.apply_chat_template(messages, tokenize=False,
                                                     add_generation_prompt=add_generation_prompt)
    assert ours == theirs
    ids = hf_smollm_tokenizer.apply_chat_template(messages, tokenize=True, return_dict=False,
                                                  add_generation_prompt=add_generation_prompt)
    assert smollm_tokenizer.encode_chat(messages, add_generation_prompt=add_generation_prompt) == list(ids)


def test_default_system_prompt_and_generation_prompt(smollm_tokenizer):
    text = smollm_tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("template", [
    "{{ messages.__class__.__mro__ }}",
    "{{ ''.__class__.__subclasses__() }}",
    "{{ messages[0].content.__class__.__init__.__globals__ }}",
    "{% set ns = namespace(__x=1) %}{{ ns }}",
    "{% set ns = namespace(a=1) %}{% set ns.__class__ = 2 %}",
    "{{ messages.append({'role': 'user'}) }}",  # immutable sandbox: no mutation of inputs
    "{{ cycler.__init__.__globals__.os }}",
])
def test_sandbox_blocks_escapes(template):
    with pytest.raises(ChatTemplateError):
        render_chat_template(template, [{"role": "user", "content": "x"}])


def test_helpers_available_to_templates():
    with pytest.raises(ChatTemplateError, match="only user roles"):
        render_chat_template("{{ raise_exception('only user roles') }}", [])
    rendered = render_chat_template(
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m | tojson }}{% endfor %}"
        "|{{ strftime_now('%Y') | length }}|{{ bos_token }}",
        [{"role": "user", "content": "héllo"}, {"role": "user", "content": "ignored"}], bos_token="<s>")
    assert rendered == '{"role": "user", "content": "héllo"}|4|<s>'


def test_bad_messages_are_a_template_error():
    with pytest.raises(ChatTemplateError):
        render_chat_template("{{ messages }}", "not a list")
    with pytest.raises(ChatTemplateError):
        render_chat_template("{{ messages[0]['content'] + 1 }}", [{"role": "user", "content": "x"}])
