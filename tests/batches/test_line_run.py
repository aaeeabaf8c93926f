"""How a line's refusal becomes its outcome: "later" (back to pending, the runner backs off), the server's own
failure (tried again, then final), or final (the line fails with the live error body)."""

from __future__ import annotations

import pytest

from batches.services.line_run import _refusal
from common.errors import ApiError, InsufficientQuota, InvalidRequest, RateLimited, ServiceUnavailable


def test_rate_limits_and_a_full_queue_wait_for_later():
    limited = _refusal(RateLimited("slow down", headers={"Retry-After": "7"}))
    assert limited.retry and limited.status_code is None and limited.retry_after_s == 7.0
    full = _refusal(ServiceUnavailable("full", code="queue_full", headers={"Retry-After": "2"}))
    assert full.retry and full.retry_after_s == 2.0
    assert _refusal(RateLimited("x", headers={"Retry-After": "junk"})).retry_after_s == 1.0
    assert _refusal(RateLimited("x", headers={"Retry-After": "86400"})).retry_after_s == 60.0


def test_a_budget_that_ran_out_fails_the_line_with_insufficient_quota():
    outcome = _refusal(InsufficientQuota("budget spent"))
    assert not outcome.retry and outcome.status_code == 429
    assert outcome.body["error"]["code"] == "insufficient_quota"


@pytest.mark.parametrize("status", [500, 502])
def test_the_servers_own_failure_is_tried_again_with_its_body_kept(status):
    outcome = _refusal(ApiError("the worker died", status=status, error_type="server_error", code="engine_error"))
    assert outcome.retry and outcome.status_code == status and outcome.body["error"]["code"] == "engine_error"


def test_a_client_error_is_final_with_the_live_body():
    outcome = _refusal(InvalidRequest("too many tokens", param="max_tokens", code="invalid_value"))
    assert not outcome.retry and outcome.status_code == 400
    assert outcome.body["error"]["param"] == "max_tokens"
