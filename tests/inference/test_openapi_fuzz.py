"""Schemathesis against a live server, driven by its own /v1/openapi.json: no 5xx, every response conforms.

The server of the hostile-input tests (tests/security/hostile_server.py: the
embedded mode, the real model on the CPU), on SQLite under `make test` and
on its own PostgreSQL database under `make test-postgres`. Every
operation of the document gets a bounded number of generated requests,
valid and invalid (Schemathesis' positive and negative modes), with a
tenant's key; the checks are: not a server error, a documented status, a
documented content type, and a body that matches the documented schema.

The document served is the API's; the copy the generator reads is narrowed
where the real model would make a case slow: max_tokens is required and at
most 2, prompts, messages, tools and calls are short; and `model` names the served model
(any other name is a 404, which the negative cases still reach). Nothing
else is changed.
"""

from __future__ import annotations

from collections import Counter

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance, response_schema_conformance, status_code_conformance,
)

from tests.e2e.processes import MODEL
from tests.security.hostile_server import hostile_server_shared

pytestmark = [pytest.mark.slow]

# Generated requests per operation and mode; the two generation endpoints run the model (2 tokens each).
MAX_EXAMPLES = 10
MAX_EXAMPLES_GENERATING = 4
GENERATING = ("POST /v1/chat/completions", "POST /v1/completions")
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
SHORT_TEXT = {"type": "string", "maxLength": 40}


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory, pytestconfig):
    return hostile_server_shared(tmp_path_factory, pytestconfig)


def narrowed(document: dict) -> dict:
    """The document with the generation endpoints' output capped (the model runs on the CPU)."""
    schemas = document["components"]["schemas"]
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        body = schemas[name]
        body["required"] = sorted({*body["required"], "max_tokens"})
        body["properties"]["model"] = {"const": MODEL}  # the model the server serves (a name, not in the schema)
        body["properties"]["max_tokens"] = {"type": "integer", "minimum": 1, "maximum": 2}
        body["properties"]["min_tokens"] = {"type": ["integer", "null"], "minimum": 0, "maximum": 1}
        body["properties"].pop("max_completion_tokens", None)
    schemas["ChatCompletionRequest"]["properties"]["messages"].update(maxItems=2)
    short = [SHORT_TEXT, {"type": "array", "maxItems": 2, "items": {
        "type": "object", "required": ["type", "text"], "properties": {"type": {"const": "text"}, "text": SHORT_TEXT}}}]
    for message in schemas["ChatCompletionRequest"]["properties"]["messages"]["items"]["anyOf"]:  # by role
        nullable = {"type": "null"} in message["properties"]["content"]["anyOf"]
        message["properties"]["content"] = {"anyOf": [{"type": "null"}, *short] if nullable else short}
        if "tool_calls" in message["properties"]:
            message["properties"]["tool_calls"]["maxItems"] = 2
    schemas["ChatCompletionRequest"]["properties"]["tools"]["maxItems"] = 2
    schemas["CompletionRequest"]["properties"]["prompt"] = {"anyOf": [
        SHORT_TEXT, {"type": "array", "minItems": 1, "maxItems": 8, "items": {"type": "integer", "minimum": 0,
                                                                              "maximum": 2**31 - 1}}]}
    return document


def _run(operation, mode: GenerationMode, server, statuses: Counter) -> None:
    headers = {"Authorization": f"Bearer {server.keys['enterprise']}"}  # a tenant of its own

    examples = MAX_EXAMPLES_GENERATING if operation.label in GENERATING else MAX_EXAMPLES

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case):
        response = case.call_and_validate(base_url=server.url, headers=headers, checks=CHECKS, timeout=120)
        statuses[(operation.label, mode.value, response.status_code)] += 1

    try:
        run()
    except Unsatisfiable:  # nothing in the operation can be made invalid (no parameters, no body)
        assert mode is GenerationMode.NEGATIVE, operation.label


def test_every_operation_answers_as_documented(fuzz_server):
    """Each operation x (valid, invalid) inputs: failures are collected, then reported together."""
    document = httpx.get(f"{fuzz_server.url}/v1/openapi.json", timeout=30).json()
    api = schemathesis.openapi.from_dict(narrowed(document))
    failures, ran, statuses = [], [], Counter()
    for result in api.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            ran.append((operation.label, mode.value))
            try:
                _run(operation, mode, fuzz_server, statuses)
            except Exception as exc:  # noqa: BLE001 - every failure is reported below
                failures.append(f"{operation.label} [{mode.value}]: {exc}")
    assert len(ran) == 2 * sum(len(item) for item in document["paths"].values())
    assert not failures, "\n\n".join(failures)
    # the generated requests reached the real work, not only the validation in front of it
    for label in (*GENERATING, "GET /v1/keys", "GET /v1/models"):
        assert statuses[(label, "positive", 200)] > 0, (label, sorted(statuses.items()))
