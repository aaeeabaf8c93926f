"""DRF's JSON parser with common.json_body's rules (settings.REST_FRAMEWORK's DEFAULT_PARSER_CLASSES)."""

from __future__ import annotations

from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from common.json_body import JsonBodyError, json_loads


class JsonBodyParser(JSONParser):
    """DRF's JSON parser (settings.REST_FRAMEWORK's DEFAULT_PARSER_CLASSES) with `json_loads`' rules: a body
    nested too deep, NaN/Infinity or invalid UTF-8 is a ParseError (400 `invalid_json`), never a 500."""

    def parse(self, stream, media_type=None, parser_context=None):
        encoding = (parser_context or {}).get("encoding") or "utf-8"
        raw = stream.read() if stream is not None else b""
        try:
            if encoding.lower().replace("_", "-") not in ("utf-8", "utf8"):
                raw = raw.decode(encoding)
            return json_loads(raw)
        except (JsonBodyError, UnicodeDecodeError, LookupError) as exc:
            raise ParseError(f"We could not parse the JSON body of your request ({exc}).") from None
