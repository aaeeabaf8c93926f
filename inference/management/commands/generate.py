"""python manage.py generate --model NAME (--prompt TEXT | --messages-file FILE)
    --max-tokens N --temperature T --seed S [--dtype float32|bfloat16] [--json]

Offline generation with the engine, no server. Works right after install, before
any migration: built-in model names resolve in code (inference.engine.registry) and
the database is consulted only for a name the code does not know. `--prompt` is
sent as one user message through the model's chat template (`--raw`: as plain text).
`--json` prints {"text", "token_ids", "prompt_token_ids", "usage", "finish_reason"}.
"""

from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from inference.worker.engine_factory import engine_runtime_configure


def _register_from_database(name: str) -> bool:
    """Register a ServedModel row's files under `name`; False when there is no usable row
    (or no table yet: the command must work before migrations)."""
    from django.db import DatabaseError

    from inference.model_sources import SourceError

    try:
        from inference.models import ServedModel
        from inference.served_models import served_model_register

        row = ServedModel.objects.filter(name=name, enabled=True).first()
    except DatabaseError:
        return False
    if row is None:
        return False
    try:
        served_model_register(row)
    except (SourceError, ValueError):
        return False
    return True


def resolve_model_name(name: str) -> None:
    from inference.engine.registry import UnknownModelError, resolve_model

    try:
        resolve_model(name)
        return
    except UnknownModelError:
        pass
    if not _register_from_database(name):
        raise CommandError(f"Unknown model {name!r}.")


def read_messages(path: str) -> list[dict]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CommandError(f"Cannot read messages from {path}: {exc}") from exc
    messages = data.get("messages") if isinstance(data, dict) else data
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise CommandError("The messages file must hold a JSON list of {\"role\", \"content\"} objects.")
    return messages


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
        resolve_model_name(model)
        sampling = SamplingParams(max_tokens=options["max_tokens"], temperature=options["temperature"],
                                  top_p=options["top_p"], seed=options["seed"], stop=options["stop"])
        try:
            sampling.validate()
        except EngineValidationError as exc:
            raise CommandError(f"--{exc.param.replace('_', '-')}: {exc.message}") from exc
        engine_runtime_configure()
        engine = Engine(EngineConfig(model=model, device=options["device"], dtype=options["dtype"],
                                     kv_cache_mb=options["kv_cache_mb"], max_num_seqs=1))
        tokenizer = engine.tokenizer
        if options["messages_file"]:
            prompt_ids = tokenizer.encode_chat(read_messages(options["messages_file"]))
        elif options["raw"]:
            prompt_ids = tokenizer.encode(options["prompt"], add_special_tokens=True)
        else:
            prompt_ids = tokenizer.encode_chat([{"role": "user", "content": options["prompt"]}])
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
