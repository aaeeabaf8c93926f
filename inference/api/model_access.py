"""Which models a request may use, and their context length.

A model is served when it has an enabled `ServedModel` row (the same rule as
`/v1/models`, see inference.selectors); `manage.py bootstrap` creates the row
of the built-in SmolLM2. Filesystem paths are never accepted from clients,
although the engine registry would resolve them. Unknown models and
models the caller's tier may not use get the same 404 `model_not_found`, as in
OpenAI's API (it does not reveal which models exist to those who cannot use them).

Rows are cached per process for `CACHE_TTL_S` seconds: this lookup sits on
every request's latency path, and operators' changes still apply within seconds.
A served model's row read again after `REFRESH_AFTER_S` is reloaded in the
background, so a model in steady use never waits for the database on the
request path (at ~1 request/s, one request in six did: a query through the
database thread, 3-5 ms on the 2-core VM), while no row is served more than
`CACHE_TTL_S` after it was read. Unknown names (client input) are cached too,
but never reloaded ahead.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from common.errors import NotFound
from inference.api.background import OnePerKey
from inference.models import ServedModel

CACHE_TTL_S = 5.0
REFRESH_AFTER_S = 1.0
DEFAULT_CONTEXT = 8192

_cache: dict[str, tuple[float, "ModelInfo | None"]] = {}  # name -> (monotonic time it was read, info)
_reloads = OnePerKey("reloading the served model")  # name -> a background reload in flight
_generation = 0  # bumped by every clear: a read begun before it is not cached


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str
    context_length: int
    tokenizer_source: str  # what `load_tokenizer` is given


def _not_found(name: str) -> NotFound:
    return NotFound(f"The model `{name}` does not exist or you do not have access to it.", param="model")


def _tokenizer_source(row: ServedModel) -> str:
    from inference.engine.registry import BUILTIN_MODELS, UnknownModelError, resolve_model

    if row.name in BUILTIN_MODELS:
        return row.name
    try:
        resolve_model(row.name)  # registered in this process by the model registry
        return row.name
    except UnknownModelError:
        pass
    source = row.source
    return source[len("gguf:"):] if source.startswith("gguf:") else source


def _info_from_row(row: ServedModel | None) -> ModelInfo | None:
    if row is None or not row.enabled:
        return None
    return ModelInfo(name=row.name, context_length=row.context_length or DEFAULT_CONTEXT, tokenizer_source=_tokenizer_source(row))


def model_cache_clear() -> None:
    global _generation
    _generation += 1
    _cache.clear()


async def _load(name: str) -> "ModelInfo | None":
    generation, read_at = _generation, time.monotonic()
    row = await ServedModel.objects.filter(name=name).afirst() if len(name) <= 100 else None
    info = _info_from_row(row)
    if generation == _generation:
        if len(_cache) > 1024:  # names are client input: never let the cache grow without bound
            _cache.clear()
        _cache[name] = (read_at, info)
    return info


async def amodel_info_get(*, name: str) -> ModelInfo:
    """The served model `name`, or 404."""
    now = time.monotonic()
    hit = _cache.get(name)
    if hit is not None and now - hit[0] < CACHE_TTL_S:
        info = hit[1]
        if info is not None and now - hit[0] >= REFRESH_AFTER_S:
            _reloads.start(name, lambda: _load(name))
    else:
        info = await _load(name)
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
