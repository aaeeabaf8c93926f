"""Which models a request may use, and their context length.

A model is served when it has an enabled `ServedModel` row (the same rule as
`/v1/models`, see inference.selectors); `manage.py bootstrap` creates the row
of the built-in SmolLM2. Filesystem paths are never accepted from clients,
although the engine registry would resolve them. Unknown models and
models the caller's tier may not use get the same 404 `model_not_found`, as in
OpenAI's API (it does not reveal which models exist to those who cannot use them).

Rows are cached per process (`common.cache.TtlCache`) for `CACHE_TTL_S`
seconds: this lookup sits on every request's latency path, and operators'
changes still apply within seconds. A served model's row read again after
`REFRESH_AFTER_S` is reloaded in the background, so a model in steady use never
waits for the database on the request path (a request arriving just after the
TTL would, otherwise: a query through the database thread), while no row is
served more than `CACHE_TTL_S` after it was read. Unknown names (client input)
are cached too, but never reloaded ahead.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.cache import TtlCache
from common.errors import NotFound
from inference.models import ServedModel
from inference.selectors import model_name_plausible

CACHE_TTL_S = 5.0
REFRESH_AFTER_S = 1.0
DEFAULT_CONTEXT = 8192

# name -> its ModelInfo, or None for a name that is not served; names are client input, hence the bound
_cache: TtlCache[str, "ModelInfo | None"] = TtlCache("served models", ttl=lambda: CACHE_TTL_S, max_entries=1024)
_reloads = _cache.reloads  # name -> a background reload in flight


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str
    context_length: int
    tokenizer_source: str  # what `load_tokenizer` is given
    chat_template: str | None = None  # the row's own template, replacing the one in the model's files


def _not_found(name: str) -> NotFound:
    return NotFound(f"The model `{name}` does not exist or you do not have access to it.", param="model")


def _tokenizer_source(row: ServedModel) -> str:
    """The row's model file or directory, by path (the tokenizer is loaded, and cached, per file)."""
    from inference.model_sources import SourceError, source_locate

    try:
        return source_locate(row.source).path
    except SourceError:  # files gone: the tokenizer's load fails, and the request gets 503 model_unavailable
        return row.source


def model_info_from_row(row: ServedModel | None) -> ModelInfo | None:
    if row is None or not row.enabled:
        return None
    return ModelInfo(name=row.name, context_length=row.context_length or DEFAULT_CONTEXT,
                     tokenizer_source=_tokenizer_source(row), chat_template=row.chat_template or None)


def model_cache_clear() -> None:
    _cache.clear()


async def _read(name: str) -> "ModelInfo | None":
    row = await ServedModel.objects.filter(name=name).afirst() if model_name_plausible(name) else None
    return model_info_from_row(row)


async def _load(name: str) -> "ModelInfo | None":
    generation = _cache.generation
    info = await _read(name)
    _cache.set(name, info, generation=generation)
    return info


async def amodel_info_get(*, name: str) -> ModelInfo:
    """The served model `name`, or 404."""
    entry = _cache.entry(name)
    if entry is None:
        info = await _load(name)
    else:
        info = entry.value
        if info is not None and _cache.age(entry) >= REFRESH_AFTER_S:
            _cache.refresh(name, lambda: _read(name))
    if info is None:
        raise _not_found(name)
    return info


def model_access_check(*, tier, model: str) -> None:
    """404 (not 403) when the tier may not use the model, like OpenAI."""
    if not tier.allows_model(model):
        raise _not_found(model)


def context_limit(*, tier, info: ModelInfo) -> int:
    """Tokens a request may span (prompt + output): the model's context, capped by the tier."""
    limit = info.context_length
    if getattr(tier, "max_context", 0):
        limit = min(limit, tier.max_context)
    return limit
