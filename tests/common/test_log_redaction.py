"""The log filter masks API keys, bearer tokens, api_key values and the configured secrets."""

import logging

import pytest

from common.log_redaction import MASK, RedactSecrets, redact

KEY = "sk-abcdefghij-" + "Z9" * 21 + "x"


@pytest.mark.parametrize("line", [
    f'127.0.0.1:1 - "GET /v1/models?api_key={KEY} HTTP/1.1" 401',
    f"Authorization: Bearer {KEY}",
    f'{{"type": "auth", "api_key": "{KEY}"}}',
    f"failed with key {KEY}.",
])
def test_keys_are_masked_wherever_they_stand(line):
    cleaned = redact(line)
    assert KEY.rsplit("-", 1)[1] not in cleaned and MASK in cleaned


def test_configured_secrets_are_masked_in_messages_and_tracebacks(settings, caplog):
    settings.API_KEY_PEPPER = "pepper-" + "p" * 40
    record_filter = RedactSecrets()
    logger = logging.getLogger("tests.redaction")
    logger.addFilter(record_filter)
    try:
        try:
            raise RuntimeError(f"cannot connect with {settings.API_KEY_PEPPER}")
        except RuntimeError:
            with caplog.at_level(logging.ERROR, logger="tests.redaction"):
                logger.exception("pepper is %s", settings.API_KEY_PEPPER)
    finally:
        logger.removeFilter(record_filter)
    [record] = caplog.records
    assert settings.API_KEY_PEPPER not in record.getMessage() and settings.API_KEY_PEPPER not in record.exc_text
    assert record.getMessage() == f"pepper is {MASK}"


def test_ordinary_lines_are_left_alone():
    line = '127.0.0.1:1 - "POST /v1/chat/completions HTTP/1.1" 200'
    assert redact(line, ["a-long-secret-value"]) == line
