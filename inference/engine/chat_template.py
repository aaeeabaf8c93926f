"""Rendering a model's Jinja2 chat template, sandboxed.

Templates come from model files, so they are untrusted code: they run in
jinja2's ImmutableSandboxedEnvironment (no attribute access to internals, no
mutation of the objects passed in), with the helpers Hugging Face templates
expect: `raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII
text, and the loop-control extension. Whitespace handling (trim_blocks,
lstrip_blocks) matches transformers, so the rendered text is identical.
`assistant_turn_end` finds the text that closes an assistant turn, so that a
chat reply can stop on it (Tokenizer.end_of_turn_ids). Tools reach a template
as Hugging Face passes them, a `tools=[{"type": "function", "function": ...}]`
keyword of render_chat_template; `template_uses_tools` tells whether a
template reads that variable at all (inference.api.tool_prompt).
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache

from jinja2 import meta
from jinja2.exceptions import SecurityError, TemplateSyntaxError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace


class ChatTemplateError(ValueError):
    """The template raised (e.g. via raise_exception) or could not be rendered for these messages."""


def _raise_exception(message: str):
    raise ChatTemplateError(message)


def _tojson(value, ensure_ascii: bool = False, indent=None, separators=None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _GuardedNamespace(Namespace):
    """`namespace(...)` that refuses underscore names, so a template cannot plant dunder attributes."""

    def __init__(*args, **kwargs):  # same trick as jinja's Namespace: `self` may be passed as a keyword
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _GuardedNamespace._check(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _GuardedNamespace._check(name)
        Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"templates may not set the attribute {name!r}")


def _plain(value):
    """A copy of the template input built only from JSON types; anything else becomes its str()."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return str(value)


@lru_cache(maxsize=32)
def compile_chat_template(source: str):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _GuardedNamespace
    env.globals["dict"] = lambda *args, **kwargs: dict(*args, **kwargs)
    return env.from_string(source)


@lru_cache(maxsize=32)
def template_uses_tools(source: str) -> bool:
    """Whether the template reads a `tools` variable (Qwen2.5, Qwen3, Llama 3.1 do; SmolLM2, Gemma 3 do not).
    A template that does not parse: False (rendering it reports the error)."""
    try:
        env = compile_chat_template(source).environment
        return "tools" in meta.find_undeclared_variables(env.parse(source))
    except TemplateSyntaxError:
        return False


def render_chat_template(source: str, messages: list[dict], *, add_generation_prompt: bool = True,
                         bos_token: str | None = None, eos_token: str | None = None, **extra) -> str:
    """Render `messages` with the template `source`; raises ChatTemplateError on template failures."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ChatTemplateError("messages must be a list of objects")
    try:
        return compile_chat_template(source).render(
            messages=_plain(messages), add_generation_prompt=add_generation_prompt,
            bos_token=bos_token or "", eos_token=eos_token or "", **_plain(extra),
        )
    except ChatTemplateError:
        raise
    except Exception as exc:  # a template error, a TypeError on odd content, a sandbox violation
        raise ChatTemplateError(f"chat template failed: {exc}") from exc


_PROBE = "ProbeOfTheAssistantTurnEnd"  # no spaces or markup: survives `| trim` and the like


def assistant_turn_end(source: str, *, bos_token: str | None = None, eos_token: str | None = None) -> str | None:
    """What the template writes right after an assistant message's text (Gemma: "<end_of_turn>\\n", ChatML:
    "<|im_end|>\\n"): the text a chat reply ends with. None when a one-exchange conversation cannot be rendered
    or the reply's text does not appear in it."""
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _PROBE}]
    try:
        text = render_chat_template(source, messages, add_generation_prompt=False, bos_token=bos_token,
                                    eos_token=eos_token)
    except ChatTemplateError:
        return None
    at = text.rfind(_PROBE)
    return text[at + len(_PROBE):] if at != -1 else None
