"""A logging filter that keeps API keys and the server's secrets out of every log line.

Nothing in the project logs a key on purpose; this is the net under what it
does not control: uvicorn's access log writes the request line, so a client
that puts its key in a query string (`?api_key=sk-...`) would have it logged;
an exception's message may carry a connection URL with its password. The
filter (on the console handler of settings.LOGGING, which the uvicorn loggers
use too) masks, in the message and in a traceback's text:

- anything shaped like one of our API keys (`sk-<id>-<secret>`): the secret;
- the token after `Bearer `, and the value of `api_key=` / `"api_key": "..."`;
- the literal values of SECRET_KEY, API_KEY_PEPPER, the database password and
  the bootstrap admin password.
"""

from __future__ import annotations

import logging
import re

MASK = "[redacted]"
_PATTERNS = [
    (re.compile(r"\b(sk-[a-z0-9]{10}-)[A-Za-z0-9]{8,}"), rf"\1{MASK}"),
    (re.compile(r"(?i)\b(bearer\s+)[^\s\"',;]+"), rf"\1{MASK}"),
    (re.compile(r"(?i)(api[_-]?key[\"']?\s*[:=]\s*[\"']?)[^\s\"'&,;}]+"), rf"\1{MASK}"),
]
_MIN_SECRET_CHARS = 8  # shorter configured values are not searched for (they would mask ordinary words)


def _configured_secrets() -> list[str]:
    from django.conf import settings

    values = [getattr(settings, "SECRET_KEY", ""), getattr(settings, "API_KEY_PEPPER", ""),
              getattr(settings, "BOOTSTRAP_ADMIN_PASSWORD", None) or ""]
    database = getattr(settings, "DATABASES", {}).get("default", {})
    values.append(database.get("PASSWORD") or "")
    return sorted({value for value in values if len(value) >= _MIN_SECRET_CHARS}, key=len, reverse=True)


def redact(text: str, secrets: list[str] = ()) -> str:
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    for secret in secrets:
        text = text.replace(secret, MASK)
    return text


class RedactSecrets(logging.Filter):
    """Masks secrets in a record's message and traceback (the record is changed in place; never dropped)."""

    def __init__(self, name: str = "") -> None:
        super().__init__(name)
        self._secrets: list[str] | None = None

    def _known_secrets(self) -> list[str]:
        if self._secrets is None:
            try:
                self._secrets = _configured_secrets()
            except Exception:  # noqa: BLE001 - settings not ready: patterns only, try again next record
                return []
        return self._secrets

    def filter(self, record: logging.LogRecord) -> bool:
        secrets = self._known_secrets()
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record: leave it to the handler's own error path
            return True
        cleaned = redact(message, secrets)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text, secrets)
        return True
