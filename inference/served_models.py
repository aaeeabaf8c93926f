"""Adding, changing and removing served models (`manage.py model_add`/`model_remove`, the admin), and
making a row's files known to the engine registry of a process that serves it.

A row names its files by `source` (inference.model_sources); what the files say (context length, chat
template) is read when the model is added, so an operator types only what differs. Workers
(`run_worker --model NAME`, the embedded engines) register the row's files under its name before the
engine loads (`served_model_check` / `served_model_engine_setup`, reading the row once), so any added name
serves, not only the built-in one.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from django.db import transaction

from inference.model_inspect import SourceFacts, chat_template_read, source_inspect
from inference.model_sources import SourceError, source_locate
from inference.models import ServedModel
from inference.selectors import MAX_NAME_LENGTH, model_name_plausible

DEFAULT_CONTEXT_LENGTH = 8192
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True, slots=True)
class ModelAddResult:
    model: ServedModel
    created: bool
    facts: SourceFacts | None  # what the source's files said (None: the source was left as it was)


def model_name_check(name: str) -> str:
    name = (name or "").strip()
    if not model_name_plausible(name) or any(c.isspace() for c in name):
        raise SourceError(f"a model name is 1 to {MAX_NAME_LENGTH} printable characters without spaces: {name!r}")
    return name


@transaction.atomic
def served_model_add(*, name: str, source: str | None = None, context_length: int | None = None,
                     dtype: str | None = None, chat_template_file: str | None = None, enabled: bool = True,
                     owned_by: str | None = None) -> ModelAddResult:
    """Create or update the row `name`; SourceError (nothing changed) when the source or a value is wrong.

    On update, what is not given keeps its value; a new `source` re-reads the context length from the
    files unless one is given."""
    name = model_name_check(name)
    row = ServedModel.objects.select_for_update().filter(name=name).first()
    created = row is None
    if created and not source:
        raise SourceError(f"the model {name!r} does not exist yet: give its --source")
    if context_length is not None and context_length < 1:
        raise SourceError(f"the context length must be positive, not {context_length}")
    if dtype and dtype not in DTYPES:
        raise SourceError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    facts = source_inspect(source) if source else None
    template = chat_template_read(chat_template_file) if chat_template_file else None
    row = row or ServedModel(name=name)
    if facts is not None:
        row.source = source.strip()
        row.context_length = context_length or facts.context_length or DEFAULT_CONTEXT_LENGTH
    elif context_length:
        row.context_length = context_length
    if dtype is not None:
        row.dtype = dtype
    if template is not None:
        row.chat_template = template
    if owned_by:
        row.owned_by = owned_by
    row.enabled = enabled
    row.save()
    return ModelAddResult(model=row, created=created, facts=facts)


def served_model_remove(*, name: str) -> bool:
    """Delete the row `name` (its usage records and prices keep the name); False when there was none."""
    deleted, _ = ServedModel.objects.filter(name=name).delete()
    return bool(deleted)


def served_model_register(row: ServedModel):
    """Make the row's files the engine registry's `row.name` in this process (SourceError when they are gone);
    returns the registry's ModelSource."""
    from inference.engine.registry import ModelSource, register_model

    location = source_locate(row.source)
    return register_model(row.name, ModelSource(row.name, location.kind, location.path, row.context_length or None))


@dataclass(frozen=True, slots=True)
class WorkerModel:
    path: str  # where the model's files are
    engine_options: dict  # its row's: batch_invariant (None: the engine's default), and dtype when the row sets one


def _row(name: str) -> ServedModel | None:
    return ServedModel.objects.filter(name=name).first() if model_name_plausible(name) else None


def _engine_options(row: ServedModel | None) -> dict:
    if row is None:
        return {"batch_invariant": None}  # a built-in name or a path: the registry resolves it alone; the
        # engine's default mode
    options = {"batch_invariant": row.batch_invariant}
    if row.dtype:
        options["dtype"] = row.dtype
    return options


def served_model_engine_setup(*, name: str) -> dict:
    """Before a worker builds the engine of `name`: register its row's files (when it has a row) and return
    the row's engine options (batch_invariant, and dtype when the row sets one)."""
    row = _row(name)
    if row is not None:
        served_model_register(row)
    return _engine_options(row)


def served_model_check(*, name: str) -> WorkerModel:
    """Before a worker heartbeats for `name`: where its files are (a row's source, registered under its name,
    else the registry's built-in name or a path) and its row's engine options, from one read of the row;
    SourceError naming what is wrong. `run_worker` hands the options to engine_build, which then reads no row."""
    from inference.engine.registry import UnknownModelError, resolve_model

    row = _row(name)
    if row is not None:
        return WorkerModel(path=served_model_register(row).path, engine_options=_engine_options(row))
    try:
        return WorkerModel(path=resolve_model(name).path, engine_options=_engine_options(None))
    except UnknownModelError:
        raise SourceError(f"unknown model {name!r}: add it with `manage.py model_add {name} --source ...`") from None


def serve_models() -> list[str]:
    """The models this process's embedded engines serve: settings.SERVE_MODELS (a comma-separated string or a
    list), else settings.DEFAULT_MODEL alone. Parsed once per value (a test's settings override is a new one)."""
    from django.conf import settings

    names = settings.SERVE_MODELS
    return list(_serve_models_parsed(names if isinstance(names, str) else tuple(names or ()), settings.DEFAULT_MODEL))


@lru_cache(maxsize=8)
def _serve_models_parsed(names: str | tuple[str, ...], default: str) -> tuple[str, ...]:
    if isinstance(names, str):
        names = names.split(",")
    parsed = tuple(dict.fromkeys(name.strip() for name in names if name and name.strip()))
    return parsed or (default,)
