"""One line of a batch's input file, checked as OpenAI's Batch API checks it.

A line is a JSON object `{"custom_id", "method": "POST", "url", "body"}`: `custom_id` unique in the file,
`url` the batch's endpoint, `body` accepted by the same parser as a live request to that endpoint
(inference.api.schemas.api_request_parse), for a model the tenant's tier may use, the same model on every
line; its prompt tokens are counted as the live path counts them (the tenant's batch queue:
batches.services.queue_limit). A refusal is a `LineError` (`code`, `message`, `param`, `line`: OpenAI's
`errors.data` items); the params of the body's own errors name their place in the line
(`body.messages[0].role`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from batches.text import body_text, printable_copy, storable
from common.errors import ApiError, InvalidRequest
from common.json_body import JsonBodyError, json_loads
from inference.api.model_access import model_info_from_row
from inference.api.schemas import CHAT, COMPLETIONS, api_request_parse
from inference.api.services import prompt_tokens_count
from inference.selectors import served_model_get_for_tier

# a line's url -> the live parser's endpoint
URL_ENDPOINTS = {"/v1/chat/completions": CHAT, "/v1/completions": COMPLETIONS}
MAX_CUSTOM_ID_CHARS = 512
REQUIRED = ("custom_id", "method", "url", "body")


@dataclass(frozen=True, slots=True)
class LineError:
    code: str
    message: str
    param: str | None
    line: int | None  # None: the file as a whole (empty, too many requests)

    def to_dict(self) -> dict[str, Any]:
        """As `errors.data` shows it; what it quotes of the line made storable (a JSON column's text)."""
        error = asdict(self)
        error["message"] = printable_copy(self.message)
        error["param"] = printable_copy(self.param) if self.param is not None else None
        return error


class LineRefused(Exception):
    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


@dataclass(slots=True)
class FileCheck:
    """What the lines seen so far settle for the ones after them: the ids taken, the file's model."""

    endpoint: str  # the batch's, e.g. "/v1/chat/completions"
    tier: object  # tenants.models.Tier
    custom_ids: set[str]
    model: str | None = None
    models_known: dict[str, object] | None = None  # name -> its ModelInfo, or None: not served to the tier
    input_tokens: int = 0  # the accepted lines' prompt tokens (the batch queue limit's measure)


def _envelope(raw: bytes) -> dict:
    try:
        line = json_loads(raw)
    except JsonBodyError as exc:
        raise LineRefused("invalid_json_line", f"This line is not valid JSON ({exc}).") from None
    if not isinstance(line, dict):
        raise LineRefused("invalid_json_line", "Each line must be a JSON object.")
    for name in REQUIRED:
        if name not in line:
            raise LineRefused("missing_required_parameter", f"Missing required parameter: '{name}'.", name)
    return line


def _custom_id(line: dict, check: FileCheck) -> str:
    custom_id = line["custom_id"]
    if (not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID_CHARS
            or not storable(custom_id)):
        raise LineRefused("invalid_custom_id", f"'custom_id' must be a string of 1 to {MAX_CUSTOM_ID_CHARS} "
                          "characters, with no NUL.", "custom_id")
    if custom_id in check.custom_ids:
        raise LineRefused("duplicate_custom_id", f"The custom_id {custom_id!r} is used by an earlier line; "
                          "each request needs its own.", "custom_id")
    return custom_id


def _method_and_url(line: dict, check: FileCheck) -> str:
    if line["method"] != "POST":
        raise LineRefused("invalid_method", "'method' must be 'POST'.", "method")
    url = line["url"]
    if url not in URL_ENDPOINTS:
        raise LineRefused("invalid_url", f"'url' must be one of {', '.join(URL_ENDPOINTS)}.", "url")
    if url != check.endpoint:
        raise LineRefused("mismatched_endpoint", f"The url {url} does not match the batch's endpoint "
                          f"{check.endpoint}.", "url")
    return URL_ENDPOINTS[url]


def _body(line: dict, endpoint: str):
    body = line["body"]
    if not isinstance(body, dict):
        raise LineRefused("invalid_value", "'body' must be a JSON object.", "body")
    try:
        request = api_request_parse(endpoint=endpoint, body=body)
    except ApiError as exc:
        raise LineRefused(exc.code or "invalid_request", exc.message,
                          f"body.{exc.param}" if exc.param else "body") from None
    if request.stream:
        raise LineRefused("invalid_value", "A batch's requests cannot stream: 'stream' must be false.", "body.stream")
    return request


def _model(model: str, check: FileCheck):
    known = check.models_known if check.models_known is not None else {}
    if model not in known:
        known[model] = model_info_from_row(served_model_get_for_tier(tier=check.tier, name=model))
        check.models_known = known
    if known[model] is None:
        raise LineRefused("model_not_found", f"The model `{model}` does not exist or you do not have access "
                          "to it.", "body.model")
    if check.model is not None and model != check.model:
        raise LineRefused("mismatched_model", f"The model {model!r} does not match the model of the batch's "
                          f"other requests ({check.model!r}): a batch file holds requests for one model.",
                          "body.model")
    return known[model]


def _prompt_tokens(request, info) -> int:
    """The line's prompt tokens as the live path counts them; 0 for a prompt the live path refuses (no chat
    template, a template's refusal): that line fails with the live error when it runs, and holds no queue."""
    try:
        return prompt_tokens_count(request=request, model=info)
    except InvalidRequest:
        return 0


def line_check(*, raw: bytes, check: FileCheck) -> tuple[str, str]:
    """The line's custom_id and body (JSON text, to store), or LineRefused. Records the custom_id and the model
    in `check`."""
    line = _envelope(raw)
    custom_id = _custom_id(line, check)
    check.custom_ids.add(custom_id)  # taken even when the rest of its line is refused: a later copy is a duplicate
    endpoint = _method_and_url(line, check)
    request = _body(line, endpoint)
    info = _model(request.model, check)
    if check.model is None:
        check.model = request.model
    check.input_tokens += _prompt_tokens(request, info)
    return custom_id, body_text(line["body"])
