"""`manage.py generate --model NAME` for an added model (review of issue 37): the chat template its row was given
(`model_add --chat-template`) is the one used, as the API uses it; a base model without one says to use --raw;
a row whose files are gone says so (not "unknown model"). The real engine, on a tiny GGUF."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command

from inference.engine.registry import unregister_model
from inference.engine.tokenizer import load_tokenizer
from inference.models import ServedModel
from tests.inference.gguf_helpers import tiny_base_gguf

pytestmark = pytest.mark.django_db

TEMPLATE = "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant]"


@pytest.fixture
def base_gguf(tmp_path):
    return tiny_base_gguf(tmp_path / "tiny-base.gguf")


@pytest.fixture(autouse=True)
def _unregistered():
    yield
    for name in ("tiny-chat", "tiny-base", "tiny-gone"):
        unregister_model(name)


def generate(*args) -> dict:
    out = io.StringIO()
    call_command("generate", *args, "--max-tokens", "2", "--temperature", "0", "--dtype", "float32",
                 "--kv-cache-mb", "4", "--json", stdout=out)
    return json.loads(out.getvalue().strip().splitlines()[-1])


def test_generate_uses_the_rows_chat_template(base_gguf, tmp_path):
    template = tmp_path / "chat.jinja"
    template.write_text(TEMPLATE)
    call_command("model_add", "tiny-chat", "--source", str(base_gguf), "--chat-template", str(template),
                 stdout=io.StringIO())
    tokenizer = load_tokenizer(str(base_gguf))
    assert not tokenizer.chat_template  # the files have none: only the row's can render the chat
    result = generate("--model", "tiny-chat", "--prompt", "hi")
    assert result["prompt_token_ids"] == list(tokenizer.encode("<|endoftext|>[user] hi\n[assistant]"))
    assert result["usage"]["completion_tokens"] == len(result["token_ids"]) > 0
    messages = tmp_path / "messages.json"
    messages.write_text(json.dumps([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]))
    result = generate("--model", "tiny-chat", "--messages-file", str(messages))
    assert result["prompt_token_ids"] == list(tokenizer.encode(
        "<|endoftext|>[system] Be brief.\n[user] hi\n[assistant]"))


def test_generate_on_a_base_model_asks_for_raw_and_a_gone_file_is_named(base_gguf):
    call_command("model_add", "tiny-base", "--source", str(base_gguf), stdout=io.StringIO())
    with pytest.raises(CommandError, match="no chat template.*--raw"):
        generate("--model", "tiny-base", "--prompt", "hi")
    result = generate("--model", "tiny-base", "--prompt", "hi", "--raw")
    assert result["prompt_token_ids"] == list(load_tokenizer(str(base_gguf)).encode("hi", add_special_tokens=True))
    ServedModel.objects.create(name="tiny-gone", source="gguf:/nowhere/gone.gguf", context_length=256)
    with pytest.raises(CommandError, match="Cannot load 'tiny-gone'.*is not a file"):
        generate("--model", "tiny-gone", "--prompt", "hi", "--raw")
    with pytest.raises(CommandError, match="Unknown model 'no-such-model'"):
        generate("--model", "no-such-model", "--prompt", "hi")
