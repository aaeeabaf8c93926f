"""Chat with Gemma 3 (issue 37): the real Gemma 3 270M GGUF (a base model: no chat template in its files) given
Google's Gemma 3 template by name, `manage.py model_add gemma-3-270m --source gguf:PATH --chat-template gemma3`,
then served from the embedded engine: a chat reply ends at `<end_of_turn>` (finish_reason "stop", the token not
in the text), a completion does not; non-alternating roles are a 400 from the template.

The real file comes from tests/gemma_package.py: skipped where the package is missing, a failure under CI."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import pytest
from asgiref.sync import sync_to_async
from django.core.management import CommandError, call_command

from inference.models import ServedModel
from tests.gemma_package import gemma3_gguf_path
from tests.inference.test_api_validation import check, make_key, post  # noqa: F401

GEMMA = "gemma-3-270m"
REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "inference" / "chat_templates" / "gemma3.jinja"
END_OF_TURN = 106  # `<end_of_turn>`
CONVERSATION = [
    {"role": "system", "content": "You answer with one word."},
    {"role": "user", "content": "What colour is the sky?"},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "What colour is grass?"},
]
# The base model never learnt to write its (untrained) `<end_of_turn>`: this bias makes it win where the reply
# ends and nowhere before (tests/engine/test_chat_template_gemma.py shows the same run in the engine).
BIAS = {str(END_OF_TURN): 12}


def model_add(*args) -> str:
    out = io.StringIO()
    call_command("model_add", *args, stdout=out)
    return out.getvalue()


@pytest.fixture(scope="module")
def gemma_source() -> str:
    return f"gguf:{gemma3_gguf_path()}"


@pytest.fixture(autouse=True)
def _fresh_model_cache():
    from inference.api.model_access import model_cache_clear

    model_cache_clear()
    yield
    model_cache_clear()


@pytest.mark.django_db
def test_model_add_gives_the_base_model_gemmas_template_by_name_or_file(gemma_source, monkeypatch, tmp_path):
    out = model_add(GEMMA, "--source", gemma_source)
    assert "chat template none: /v1/completions only" in out and "context length 32768" in out
    out = model_add(GEMMA, "--source", gemma_source, "--chat-template", "gemma3")
    row = ServedModel.objects.get(name=GEMMA)
    assert (row.chat_template, row.context_length, row.source) == (SHIPPED.read_text(), 32768, gemma_source)
    assert out.startswith(f"Updated {GEMMA} (enabled)") and "chat template its own (--chat-template gemma3)" in out
    monkeypatch.chdir(REPO)  # the README's form: the shipped file's path
    model_add("gemma-by-path", "--source", gemma_source, "--chat-template", "inference/chat_templates/gemma3.jinja")
    assert ServedModel.objects.get(name="gemma-by-path").chat_template == SHIPPED.read_text()
    monkeypatch.chdir(tmp_path)  # a file that exists wins over a shipped name
    (tmp_path / "gemma3").write_text("{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}")
    model_add("gemma-local", "--source", gemma_source, "--chat-template", "gemma3")
    assert ServedModel.objects.get(name="gemma-local").chat_template == (tmp_path / "gemma3").read_text()
    with pytest.raises(CommandError, match=r"cannot read the chat template gemma4: .*shipped templates: gemma3"):
        model_add("gemma-unknown", "--source", gemma_source, "--chat-template", "gemma4")
    assert not ServedModel.objects.filter(name="gemma-unknown").exists()


def _gemma_served(source: str) -> None:
    quiet = {"stdout": io.StringIO()}
    call_command("model_add", GEMMA, "--source", source, "--chat-template", "gemma3", "--dtype", "float32", **quiet)
    call_command("price_set", "--model", GEMMA, "--input", "0.03", "--cached-input", "0.015", "--output", "0.07",
                 "--effective-from", "2000-01-01T00:00:00Z", **quiet)


@pytest.fixture
def _embedded_gemma(settings):
    from inference.worker.embedded import embedded_worker_stop

    settings.EMBEDDED_WORKER = True
    settings.SERVE_MODELS = [GEMMA]
    settings.ENGINE_KV_CACHE_MB = 64
    settings.ENGINE_MAX_NUM_SEQS = 4
    yield
    embedded_worker_stop()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
async def test_a_gemma_chat_stops_at_end_of_turn(asgi_client, make_key, gemma_source, _embedded_gemma):
    await sync_to_async(_gemma_served)(gemma_source)
    key = await make_key()
    chat = {"model": GEMMA, "messages": CONVERSATION, "max_tokens": 16, "temperature": 0, "logit_bias": BIAS}
    response = await asyncio.wait_for(post(asgi_client, "/v1/chat/completions", key, chat), timeout=300)
    assert response.status_code == 200, response.text
    choice, usage = response.json()["choices"][0], response.json()["usage"]
    assert (choice["message"]["content"], choice["finish_reason"]) == ("Green.", "stop")
    assert usage["completion_tokens"] == 3  # "Green", ".", and the <end_of_turn> it stopped on
    # the same tokens as a completion: no end of turn there, it runs to its length
    from inference.engine.tokenizer import load_tokenizer

    prompt = _rendered(load_tokenizer(gemma_source.removeprefix("gguf:")))
    body = {"model": GEMMA, "prompt": prompt, "max_tokens": 6, "temperature": 0, "logit_bias": BIAS}
    response = await asyncio.wait_for(post(asgi_client, "/v1/completions", key, body), timeout=300)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "length" and choice["text"].startswith("Green.") and choice["text"] != "Green."
    # roles that do not alternate: the template refuses, a 400 on `messages`
    chat["messages"] = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    response = await post(asgi_client, "/v1/chat/completions", key, chat)
    check(response, 400, param="messages")
    assert "Conversation roles must alternate" in response.json()["error"]["message"]


def _rendered(tokenizer) -> list[int]:
    """The chat's token ids, for /v1/completions (the text would get a second BOS)."""
    from inference.engine.chat_template import render_chat_template

    return tokenizer.encode(render_chat_template(SHIPPED.read_text(), CONVERSATION, bos_token=tokenizer.bos_token,
                                                 eos_token=tokenizer.eos_token))
