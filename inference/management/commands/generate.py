"""python manage.py generate --model NAME (--prompt TEXT | --messages-file FILE)
    --max-tokens N --temperature T --seed S [--dtype float32|bfloat16] [--json]

Offline generation with the engine, no server. Works right after install, before
any migration: built-in model names resolve in code (inference.engine.registry); a
name's ServedModel row, when the database has one, gives the files of a name the
code does not know and its chat template, which replaces the files' as in the API.
`--prompt` is sent as one user message through that template (`--raw`: as plain
text), and the model's end-of-turn tokens stop the reply, as for a chat request.
`--json` prints {"text", "token_ids", "prompt_token_ids", "usage", "finish_reason"}.
"""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from inference.worker.engine_factory import engine_runtime_configure


def _served_row(name: str):
    """The enabled ServedModel row `name`, or None (also with no table yet: the command works before migrations)."""
    from django.db import DatabaseError, connection

    from inference.models import ServedModel
    from inference.selectors import model_name_plausible

    if not model_name_plausible(name):
        return None
    if connection.vendor == "sqlite":
        file = str(connection.settings_dict["NAME"])
        if not connection.creation.is_in_memory_db(file) and not Path(file).exists():
            return None  # no rows there, and asking would create the file
    try:
        return ServedModel.objects.filter(name=name, enabled=True).first()
    except DatabaseError:
        return None


def resolve_model_name(name: str):
    """Make `name` loadable: a name the engine registry knows, else a row's files registered under it; returns
    the row (whose chat template replaces the files', as in the API) or None. CommandError when neither."""
    from inference.engine.registry import UnknownModelError, resolve_model
    from inference.model_sources import SourceError
    from inference.served_models import served_model_register

    row = _served_row(name)
    try:
        resolve_model(name)
        return row
    except UnknownModelError:
        if row is None:
            raise CommandError(f"Unknown model {name!r}.") from None
    try:
        served_model_register(row)
    except SourceError as exc:  # the row's files are gone: say so, not "unknown model"
        raise CommandError(f"Cannot load {name!r}: {exc}") from exc
    return row


def read_messages(path: str) -> list[dict]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CommandError(f"Cannot read messages from {path}: {exc}") from exc
    messages = data.get("messages") if isinstance(data, dict) else data
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise CommandError("The messages file must hold a JSON list of {\"role\", \"content\"} objects.")
    return messages


def prompt_encode(tokenizer, options: dict, sampling, *, row_template: str | None) -> list[int]:
    """The prompt's token ids: `--raw` as plain text, else the chat through the model's template as the API
    renders it (the row's template, else the files'), its end-of-turn tokens added to `sampling`'s stops."""
    from common.errors import ApiError
    from inference.api.services import chat_encode

    if options["raw"] and not options["messages_file"]:
        return tokenizer.encode(options["prompt"], add_special_tokens=True)
    template = row_template or tokenizer.chat_template
    if not template:
        raise CommandError("This model has no chat template (a base model): use --raw with --prompt, or give it "
                           "one (manage.py model_add NAME --chat-template FILE).")
    messages = (read_messages(options["messages_file"]) if options["messages_file"]
                else [{"role": "user", "content": options["prompt"]}])
    try:
        prompt_ids = chat_encode(messages=messages, template=template, tokenizer=tokenizer)
    except ApiError as exc:  # the template refused these messages
        raise CommandError(exc.message) from exc
    sampling.stop_token_ids += [i for i in tokenizer.end_of_turn_ids(template) if i not in sampling.stop_token_ids]
    return prompt_ids


class Command(BaseCommand):
    help = "Generate text from a prompt or a chat with the engine (offline, no server, no database needed)."
    requires_system_checks: list = []

    def add_arguments(self, parser) -> None:
        parser.add_argument("--model", default="smollm2-135m-instruct")
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--prompt", help="text sent as one user message (see --raw)")
        source.add_argument("--messages-file", help="JSON file: a list of chat messages")
        parser.add_argument("--raw", action="store_true", help="use --prompt as plain text, no chat template")
        parser.add_argument("--max-tokens", type=int, default=128)
        parser.add_argument("--temperature", type=float, default=1.0)
        parser.add_argument("--top-p", type=float, default=1.0)
        parser.add_argument("--seed", type=int, default=None)
        parser.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
        parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
        parser.add_argument("--device", default="cpu")
        parser.add_argument("--kv-cache-mb", type=int, default=64)
        parser.add_argument("--json", action="store_true", help="print one JSON object")

    def handle(self, *args, **options) -> None:
        from inference.engine import Engine, EngineConfig, EngineValidationError, SamplingParams

        model = options["model"]
        row = resolve_model_name(model)
        sampling = SamplingParams(max_tokens=options["max_tokens"], temperature=options["temperature"],
                                  top_p=options["top_p"], seed=options["seed"], stop=options["stop"])
        try:
            sampling.validate()
        except EngineValidationError as exc:
            raise CommandError(f"--{exc.param.replace('_', '-')}: {exc.message}") from exc
        engine_runtime_configure()
        engine = Engine(EngineConfig(model=model, device=options["device"], dtype=options["dtype"],
                                     kv_cache_mb=options["kv_cache_mb"], max_num_seqs=1))
        prompt_ids = prompt_encode(engine.tokenizer, options, sampling, row_template=row and row.chat_template)
        try:
            out = engine.generate([prompt_ids], sampling)[0]
        except EngineValidationError as exc:
            raise CommandError(exc.message) from exc
        if options["json"]:
            self.stdout.write(json.dumps({
                "text": out.delta_text, "token_ids": out.new_token_ids, "prompt_token_ids": prompt_ids,
                "usage": out.usage.to_dict(), "finish_reason": out.finish_reason,
            }, ensure_ascii=False))
        else:
            self.stdout.write(out.delta_text)
