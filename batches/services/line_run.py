"""One batch line run as the live endpoint runs a request, its outcome as the output file reports it.

`aline_run` is `POST /v1/chat/completions` (or `/v1/completions`) without HTTP: the live request parser,
`arequest_prepare` (model access, tier limits, the prompt), `ajob_submit` (price, capacity, admission: the
tenant's quota and budget reserved for this line now, released or settled by the live path) and the same
chunks a non-streamed response is built from (inference.api.job_run.job_collect). The job carries the batch's
id: it runs at the batch engine priority, below every tier, and the worker bills it at the batch price under
the line's request id (one usage record per line: a line run twice is billed once).

Outcomes (`LineOutcome`):
- a 200 with the response body, or the error a live request would have got (status and OpenAI error body),
  both final: the line is `completed` or `failed`;
- `retry`: a refusal that says "later", not "no" (rate limits, a full queue, the model or a store away):
  the line goes back to pending and the runner backs off (`retry_after_s`);
- `retry` with a status: the server's own failure (a 500: the worker running it died, or the engine failed),
  tried again up to BATCH_LINE_ATTEMPTS times, then the line fails with it. A record the failed try wrote
  (what it generated before the worker died) stays the line's only one: the retry is not billed again.
A budget or quota that ran out (`insufficient_quota`) is final: the line fails with that error, as OpenAI's
batches report it, and nothing past the budget runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from common.errors import ApiError, InvalidRequest
from common.outage import connection_lost
from inference.api.job_run import job_collect
from inference.api.responses import response_builder
from inference.api.schemas import api_request_parse
from inference.api.services import ajob_submit, arequest_prepare
from tenants.services.api_keys import AuthContext

RETRY_STATUSES = frozenset({429, 503})
FINAL_CODES = frozenset({"insufficient_quota"})  # a 429 that will not pass by waiting within the period


@dataclass(slots=True)
class LineOutcome:
    status_code: int | None = None
    body: dict | None = None
    retry: bool = False
    retry_after_s: float = 0.0


def _refusal(exc: ApiError) -> LineOutcome:
    if exc.status_code >= 500 and exc.status_code not in RETRY_STATUSES:
        return LineOutcome(status_code=exc.status_code, body=exc.body(), retry=True, retry_after_s=1.0)
    if exc.status_code in RETRY_STATUSES and exc.code not in FINAL_CODES:
        try:
            wait = float(exc.headers.get("Retry-After", "1"))
        except (TypeError, ValueError):
            wait = 1.0
        return LineOutcome(retry=True, retry_after_s=max(0.5, min(wait, 60.0)))
    return LineOutcome(status_code=exc.status_code, body=exc.body())


async def aline_run(*, auth: AuthContext, endpoint: str, body: str, request_id: str, batch_id: str) -> LineOutcome:
    """Run one line (its `body` as stored: JSON text) for `auth` (the batch's tenant, tier and key)."""
    try:
        data = json.loads(body)
        if not isinstance(data, dict):
            raise InvalidRequest("The request body must be a JSON object.")
        request = api_request_parse(endpoint=endpoint, body=data)
        prepared = await arequest_prepare(auth=auth, request=request, request_id=request_id)
        prepared.batch_id = batch_id
        builder = response_builder(prepared=prepared)
        run = await ajob_submit(prepared=prepared)
        return LineOutcome(status_code=200, body=await job_collect(run, builder))
    except ApiError as exc:
        return _refusal(exc)
    except ValueError as exc:  # stored lines were checked at validation; a body that no longer parses fails alone
        return LineOutcome(status_code=400, body=InvalidRequest(f"The request body is not valid JSON: {exc}").body())
    except Exception as exc:
        if connection_lost(exc):  # the database or Redis away for a moment: the line waits, nothing was billed
            return LineOutcome(retry=True, retry_after_s=2.0)
        raise
