"""A request's `response_format` on the web side: parsed (`response_format_parse`, OpenAI's shapes and params),
then checked before anything is reserved or queued.

`aresponse_format_check` runs the engine's own check (inference.engine.structured_spec.check: the size and
depth bounds, then llguidance's JSON-schema compiler without a tokenizer, which names the keywords a strict
schema cannot have enforced) so that a bad schema is a 400 naming the problem, not an engine error after
admission. The compile takes milliseconds for typical schemas and about a second at worst (llguidance's fuel
limits), so it runs off the event loop, in a small pool of its own: a flood of hostile schemas waits behind
itself, not behind the default executor other requests' work (tokenizer loads, Redis calls) uses.

Results are cached by the spec's canonical key (`StructuredOutput.key`, hashed: keys may be 100k characters),
failures too, in a bounded LRU of futures: a hot schema costs a dict lookup, a hostile one sent again fails at
once, and concurrent requests with the same new schema share one compile.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor

from common.errors import InvalidRequest
from inference.api.fields import brief, invalid, text_check, type_error
from inference.engine.sampling_params import EngineValidationError
from inference.engine.structured_spec import StructuredOutput, check

logger = logging.getLogger(__name__)

CACHE_SIZE = 1024
THREADS = 2
PARAM = "response_format"

_SCHEMA_NAME_RE = re.compile(r"[a-zA-Z0-9_-]{1,64}")
RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")
_lock = threading.Lock()
_cache: OrderedDict[bytes, Future] = OrderedDict()
_pool: ThreadPoolExecutor | None = None


def response_format_parse(*, body: dict) -> StructuredOutput | None:
    """OpenAI's `response_format` as the engine's StructuredOutput (inference.engine.structured_spec), or None
    for `{"type": "text"}` and absent. The shape only; the schema itself is checked by
    `aresponse_format_check` below (size, depth, then llguidance) before anything is reserved."""
    value = body.get("response_format")
    if value is None:
        return None
    if not isinstance(value, dict):
        raise type_error("response_format", "an object", value)
    kind = value.get("type")
    if kind is None:
        raise invalid("Missing required parameter: 'response_format.type'.", "response_format.type",
                      "missing_required_parameter")
    if kind not in RESPONSE_FORMAT_TYPES:
        raise invalid(f"Invalid value: {brief(kind)}. Supported values are: 'text', 'json_object' and 'json_schema'.",
                      "response_format.type")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput("json_object")
    spec = value.get("json_schema")
    where = "response_format.json_schema"
    if spec is None:
        raise invalid(f"Missing required parameter: '{where}'.", where, "missing_required_parameter")
    if not isinstance(spec, dict):
        raise type_error(where, "an object", spec)
    name = spec.get("name")
    if name is None:
        raise invalid(f"Missing required parameter: '{where}.name'.", f"{where}.name", "missing_required_parameter")
    text_check(name, f"{where}.name")
    if not _SCHEMA_NAME_RE.fullmatch(name):
        raise invalid(f"Invalid '{where}.name': string does not match pattern. Expected a string that matches the "
                      f"pattern '^[a-zA-Z0-9_-]{{1,64}}$'.", f"{where}.name")
    description = spec.get("description")
    if description is not None:
        text_check(description, f"{where}.description")
    schema = spec.get("schema")
    if schema is None:
        raise invalid(f"Missing required parameter: '{where}.schema' (this server needs the JSON Schema the "
                      "output must follow).", f"{where}.schema", "missing_required_parameter")
    if not isinstance(schema, dict):
        raise type_error(f"{where}.schema", "an object", schema)
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise type_error(f"{where}.strict", "a boolean", strict)
    return StructuredOutput("json_schema", schema, bool(strict))


def _executor() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="response-format-check")
    return _pool


def _check(spec: StructuredOutput) -> None:
    try:
        check(spec)
    except EngineValidationError:
        raise
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # noqa: BLE001 - whatever llguidance raises on a client's schema is a 400, never
        # a 500; that includes a Rust panic (pyo3's PanicException derives from BaseException: llguidance 1.9.1
        # panics while quoting some invalid schemas that hold non-ASCII text), which must not reach the engine
        logger.warning("response_format check raised %s", type(exc).__name__, exc_info=True)
        raise EngineValidationError(f"Invalid JSON schema in {spec.param}: it could not be compiled "
                                    f"({type(exc).__name__})", spec.param) from None


def response_format_future(spec: StructuredOutput) -> Future:
    """The (cached) future of `spec`'s check: its result is None, its exception an EngineValidationError.
    `spec` must have passed `validate()` (its key is computed; the size bound holds)."""
    key = hashlib.sha256(spec.key.encode("utf-8", "surrogatepass")).digest()
    with _lock:
        future = _cache.get(key)
        if future is not None:
            _cache.move_to_end(key)
            return future
        future = _executor().submit(_check, spec)
        _cache[key] = future
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)
    return future


async def astructured_check(*, spec: StructuredOutput) -> None:
    """Raise EngineValidationError when the engine would refuse `spec` (cached, off the event loop). Also
    what inference.api.tool_calls.atools_check runs for each forced function's parameters."""
    spec.validate()
    future = response_format_future(spec)
    if future.done():  # a cache hit: no hop through the loop
        future.result()
    else:
        await asyncio.shield(asyncio.wrap_future(future))  # a cancelled request leaves the compile to the cache


async def aresponse_format_check(*, spec: StructuredOutput) -> None:
    """Raise InvalidRequest (param `response_format`) when the engine would refuse `spec`'s schema."""
    try:
        await astructured_check(spec=spec)
    except EngineValidationError as exc:
        raise InvalidRequest(exc.message, param=exc.param or PARAM, code="invalid_value") from None


def response_format_cache_clear() -> None:
    """(Tests.) Forget every cached result."""
    with _lock:
        _cache.clear()
