"""Path converters for ids in URLs: a path the converter refuses matches no route, so it is a 404, never a 500.

Django's `<int:...>` accepts any run of digits (`99999999999999999999` does
not fit a 64-bit column: the database driver raises, a 500) and `<str:...>`
accepts anything, so a view that checks `text.isdigit()` before `int(text)`
meets "²" (a digit to `isdigit()`, not to `int()`). Every route that takes an
id uses one of these two instead (registered when this module is first imported: each
urls.py that uses them imports it):

- `<public_id:name>`: an opaque public id (`key_...`, `inv_...`): ASCII
  letters, digits, `_` and `-`, 1 to PUBLIC_ID_MAX_CHARS characters, passed to
  the view as the string;
- `<row_id:name>`: a row's integer id: ASCII digits only, 1 to 18 of them and
  at most 2**63 - 1 (a BigAutoField holds it), passed as an int.

A refused id is a 404: in the OpenAI error shape under /v1 (common.errors
handler404, common.middleware), Django's 404 page elsewhere.
"""

from __future__ import annotations

from django.urls import register_converter

PUBLIC_ID_MAX_CHARS = 64
ROW_ID_MAX = 2**63 - 1


class PublicIdConverter:
    regex = f"[A-Za-z0-9_-]{{1,{PUBLIC_ID_MAX_CHARS}}}"  # character ranges, not \w: ASCII only

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value) -> str:
        return str(value)


class RowIdConverter:
    regex = "[0-9]{1,19}"  # not \d, which matches every Unicode digit

    def to_python(self, value: str) -> int:
        number = int(value)
        if number > ROW_ID_MAX:
            raise ValueError("larger than a row id")  # Django: this pattern does not match
        return number

    def to_url(self, value) -> str:
        return str(int(value))


CONVERTERS = {"public_id": PublicIdConverter, "row_id": RowIdConverter}


def _register() -> None:
    from django.urls.converters import get_converters

    registered = get_converters()
    for name, converter in CONVERTERS.items():
        if name not in registered:  # (Django refuses to register a name twice)
            register_converter(converter, name)


_register()
