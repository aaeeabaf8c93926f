"""What a served model's files say, read from their metadata only (never the weights): `source_inspect`
checks that the files of a source (inference.model_sources) are there, readable and of a model the engine
can serve (its architecture, its tokenizer), and reads what an operator would otherwise type, the context
length and the chat template; and `--chat-template`, a file or a template shipped by name
(inference/chat_templates/). `manage.py model_add` and the ServedModel admin use it; the API does not (it
reads the GGUF reader's modules, which import-linter keeps off the web's request path).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from inference.model_sources import LocatedSource, SourceError, source_locate


@dataclass(frozen=True, slots=True)
class SourceFacts:
    """What a model's own files say: its context length and chat template (None: none in the files)."""

    location: LocatedSource
    context_length: int | None
    chat_template: str | None
    architecture: str


def source_inspect(source: str) -> SourceFacts:
    """`source_locate`, then the model's metadata: SourceError when it cannot be read or served."""
    location = source_locate(source)
    try:
        if location.kind == "gguf":
            return _gguf_facts(location)
        return _hf_facts(location)
    except SourceError:
        raise
    except (OSError, ValueError, KeyError, NotImplementedError) as exc:
        raise SourceError(f"{location.path}: {exc}") from exc


def _gguf_facts(location: LocatedSource) -> SourceFacts:
    from inference.engine.gguf_loader import config_from_gguf_metadata, read_gguf_header
    from inference.engine.tokenizer import Tokenizer

    metadata, tensors = read_gguf_header(location.path)
    config = config_from_gguf_metadata(metadata, set(tensors))  # an architecture the engine runs
    tokenizer = Tokenizer.from_gguf_metadata(metadata)  # the web tokenizes with it
    arch = metadata.get("general.architecture")
    context = metadata.get(f"{arch}.context_length") or config.max_position_embeddings
    return SourceFacts(location, int(context) if context else None, tokenizer.chat_template or None, str(arch))


def _hf_facts(location: LocatedSource) -> SourceFacts:
    from inference.engine.tokenizer import Tokenizer

    path = Path(location.path)
    config = json.loads((path / "config.json").read_text())
    if not any(path.glob("*.safetensors")):
        raise SourceError(f"{path} holds no *.safetensors weights")
    if not (path / "tokenizer.json").is_file():
        raise SourceError(f"{path} has no tokenizer.json")
    tokenizer = Tokenizer.from_hf_directory(path)
    context = config.get("max_position_embeddings")
    architecture = (config.get("architectures") or [config.get("model_type", "unknown")])[0]
    return SourceFacts(location, int(context) if context else None, tokenizer.chat_template or None,
                       str(architecture))


# Templates shipped for models whose files have none (inference/chat_templates/README.md says where each is from).
CHAT_TEMPLATES_DIR = Path(__file__).resolve().parent / "chat_templates"


def chat_template_names() -> list[str]:
    """The shipped templates' names (`model_add --chat-template gemma3`)."""
    return sorted(p.stem for p in CHAT_TEMPLATES_DIR.glob("*.jinja"))


def chat_template_path(path_or_name: str) -> Path:
    """A template file: `path_or_name` itself when it exists, else the shipped template of that name."""
    path = Path(path_or_name).expanduser()
    if not path.exists() and path_or_name in chat_template_names():
        return CHAT_TEMPLATES_DIR / f"{path_or_name}.jinja"
    return path


def chat_template_read(path_or_name: str) -> str:
    """The text of a chat template (`model_add --chat-template FILE|NAME`), checked to compile."""
    from inference.engine.chat_template import compile_chat_template

    path = chat_template_path(path_or_name)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceError(f"cannot read the chat template {path_or_name}: {exc} (a file, or one of the shipped "
                          f"templates: {', '.join(chat_template_names())})") from exc
    if not text.strip():
        raise SourceError(f"the chat template {path_or_name} is empty")
    try:
        compile_chat_template(text)
    except Exception as exc:  # noqa: BLE001 - jinja2's TemplateSyntaxError and friends
        raise SourceError(f"the chat template {path_or_name} does not compile: {exc}") from exc
    return text
