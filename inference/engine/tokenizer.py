"""The model's tokenizer, built with the `tokenizers` library.

From a GGUF we rebuild what the file's metadata describes: a SentencePiece
vocabulary (`tokenizer.ggml.model == "llama"`, see tokenizer_spm.py) or a byte-level BPE
(`tokenizer.ggml.model == "gpt2"`) over tokenizer.ggml.tokens/merges, the
pre-tokenizer named by tokenizer.ggml.pre (as llama.cpp defines it), the
control tokens (token_type 3) as special tokens and user-defined ones (4) as
plain added tokens. Only the metadata header is read, never the weights, so
the web process can tokenize cheaply. A Hugging Face directory uses its own
tokenizer.json and tokenizer_config.json.
"""

from __future__ import annotations

import json
import logging
from functools import cached_property, lru_cache
from pathlib import Path

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as BackendTokenizer

from .chat_template import assistant_turn_end, render_chat_template
from .gguf_loader import read_gguf_metadata
from .registry import resolve_model
from .tokenizer_spm import spm_tokenizer_parts

logger = logging.getLogger(__name__)

TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
# Special tokens that end a turn in the common chat formats (Gemma, ChatML, Llama 3, Phi-3), for templates whose
# turn end `assistant_turn_end` cannot find: one counts when the template writes it and the vocabulary has it.
END_OF_TURN_TOKENS = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|end|>")

_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _gpt2_split() -> pre_tokenizers.PreTokenizer:
    # ByteLevel with use_regex applies GPT-2's split: 's|'t|...| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_gpt2() -> pre_tokenizers.PreTokenizer:
    # llama.cpp's "smollm"/"starcoder" family: every digit on its own (\p{N}), then GPT-2's split.
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2_split()])


def _regex_split(pattern: str):
    def build() -> pre_tokenizers.PreTokenizer:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    return build


PRE_TOKENIZERS = {
    "default": _gpt2_split, "gpt2": _gpt2_split, "gpt-2": _gpt2_split, "mpt": _gpt2_split, "olmo": _gpt2_split,
    "jais": _gpt2_split,
    "smollm": _digits_then_gpt2, "starcoder": _digits_then_gpt2, "refact": _digits_then_gpt2,
    "command-r": _digits_then_gpt2, "codeshell": _digits_then_gpt2, "exaone": _digits_then_gpt2,
    "minerva-7b": _digits_then_gpt2,
    "llama3": _regex_split(_LLAMA3_SPLIT), "llama-v3": _regex_split(_LLAMA3_SPLIT),
    "llama-bpe": _regex_split(_LLAMA3_SPLIT), "smaug-bpe": _regex_split(_LLAMA3_SPLIT),
    "qwen2": _regex_split(_QWEN2_SPLIT), "deepseek-r1-qwen": _regex_split(_QWEN2_SPLIT),
}


def byte_alphabet() -> dict[int, str]:
    """GPT-2's reversible map from each byte to a printable character."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


class Tokenizer:
    """encode/decode, chat template and special-token facts for one model."""

    def __init__(self, backend: BackendTokenizer, *, bos_token_id: int | None, eos_token_id: int,
                 chat_template: str | None, add_bos_token: bool = False, add_eos_token: bool = False,
                 special_ids: set[int] | None = None, byte_level: bool = True,
                 token_bytes: list[bytes] | None = None) -> None:
        self.backend = backend
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.chat_template = chat_template
        self.add_bos_token = add_bos_token
        self.add_eos_token = add_eos_token
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        ids = set(special_ids or ())
        ids.update(i for i in (bos_token_id, eos_token_id) if i is not None)
        self.all_special_ids = sorted(ids)
        self.bos_token = backend.id_to_token(bos_token_id) if bos_token_id is not None else None
        self.eos_token = backend.id_to_token(eos_token_id)
        self._byte_level = byte_level
        self._token_bytes: list[bytes] | None = token_bytes  # (else built from the vocabulary on first use)
        self._token_texts: list[str | None] | None = None
        self._end_of_turn: dict[str, tuple[int, ...]] = {}  # template -> end_of_turn_ids

    # -- text <-> ids ---------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = self.backend.encode(text, add_special_tokens=False).ids
        if add_special_tokens:
            if self.add_bos_token and self.bos_token_id is not None:
                ids = [self.bos_token_id, *ids]
            if self.add_eos_token:
                ids = [*ids, self.eos_token_id]
        return ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary entry as spelled in the vocabulary (byte-level spelling, e.g. 'Ġhello')."""
        return self.backend.id_to_token(int(token_id))

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes a token stands for (a piece of UTF-8 that may be incomplete on its own)."""
        return self.token_bytes_table()[int(token_id)]

    @property
    def byte_level(self) -> bool:
        """Byte-level BPE (GPT-2 style): a text is its tokens' bytes (`token_bytes`) decoded as UTF-8."""
        return self._byte_level

    def token_bytes_table(self) -> list[bytes]:
        """`token_bytes` of every id, indexed by id (built once, on first use)."""
        if self._token_bytes is None:
            self._token_bytes = self._build_token_bytes()
        return self._token_bytes

    def token_text_table(self) -> list[str | None]:
        """Each id's bytes as text when they are whole UTF-8 characters on their own, else None (a piece of
        a character, or invalid bytes), indexed by id (built once, on first use)."""
        if self._token_texts is None:
            texts: list[str | None] = []
            for piece in self.token_bytes_table():
                try:
                    texts.append(piece.decode("utf-8"))
                except UnicodeDecodeError:
                    texts.append(None)
            self._token_texts = texts
        return self._token_texts

    @cached_property
    def skipped_special_ids(self) -> frozenset[int]:
        """The ids `decode(..., skip_special_tokens=True)` leaves out: the backend's special added tokens."""
        return frozenset(i for i, token in self.backend.get_added_tokens_decoder().items() if token.special)

    def _build_token_bytes(self) -> list[bytes]:
        table: list[bytes] = []
        if self._byte_level:
            unbyte = {c: b for b, c in byte_alphabet().items()}
            for i in range(self.vocab_size):
                piece = self.backend.id_to_token(i) or ""
                if all(c in unbyte for c in piece):
                    table.append(bytes(unbyte[c] for c in piece))
                else:
                    table.append(piece.encode("utf-8"))
        else:
            for i in range(self.vocab_size):
                table.append(self.backend.decode([i], skip_special_tokens=False).encode("utf-8"))
        return table

    # -- chat ------------------------------------------------------------------------------------
    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> str:
        if not self.chat_template:
            raise ValueError("this model has no chat template")
        return render_chat_template(self.chat_template, messages, add_generation_prompt=add_generation_prompt,
                                    bos_token=self.bos_token, eos_token=self.eos_token, **kwargs)

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> list[int]:
        return self.encode(self.apply_chat_template(messages, add_generation_prompt, **kwargs))

    def end_of_turn_ids(self, template: str | None = None) -> tuple[int, ...]:
        """The special tokens other than EOS that end an assistant turn under `template` (default: the model's
        own): a chat request stops on them, as an instruction-tuned model's generation config says (Gemma 3:
        `<eos>` and `<end_of_turn>`). The first token of what the template writes after a reply's text, when it
        is a special token, and any END_OF_TURN_TOKENS the template writes; computed once per template."""
        template = self.chat_template if template is None else template
        if not template:
            return ()
        found = self._end_of_turn.get(template)
        if found is None:
            found = self._end_of_turn[template] = self._find_end_of_turn(template)
        return found

    def _find_end_of_turn(self, template: str) -> tuple[int, ...]:
        special = set(self.all_special_ids)
        ids: list[int] = []
        ending = assistant_turn_end(template, bos_token=self.bos_token, eos_token=self.eos_token)
        first = self.encode(ending)[:1] if ending else []
        if first and first[0] in special:  # a special token, never plain text such as a newline
            ids.append(first[0])
        for token in END_OF_TURN_TOKENS:
            token_id = self.token_to_id(token) if token in template else None
            if token_id is not None and token_id in special and token_id not in ids:
                ids.append(token_id)
        return tuple(i for i in ids if i != self.eos_token_id)  # EOS stops every request already

    # -- construction ----------------------------------------------------------------------------
    @classmethod
    def from_gguf_metadata(cls, metadata: dict) -> Tokenizer:
        kind = metadata.get("tokenizer.ggml.model")
        if kind == "llama":  # SentencePiece (Gemma, Llama 2, Mistral...)
            return cls(**spm_tokenizer_parts(metadata))
        if kind != "gpt2":
            raise NotImplementedError(f"GGUF tokenizer model {kind!r} is not supported "
                                      "(byte-level BPE, 'gpt2', and SentencePiece, 'llama')")
        tokens: list[str] = metadata["tokenizer.ggml.tokens"]
        types: list[int] = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        alphabet = byte_alphabet()
        spelled = set(alphabet.values())

        def spell(token: str) -> str:  # a token outside the byte alphabet is re-spelled from its UTF-8 bytes
            return token if set(token) <= spelled else "".join(alphabet[b] for b in token.encode("utf-8"))

        vocab = {spell(token): index for index, token in enumerate(tokens)}
        merges = [tuple(m.split(" ", 1)) for m in metadata.get("tokenizer.ggml.merges", [])]
        backend = BackendTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
        pre = metadata.get("tokenizer.ggml.pre", "default")
        if pre not in PRE_TOKENIZERS:
            logger.warning("unknown GGUF pre-tokenizer %r; using GPT-2's split", pre)
        backend.pre_tokenizer = PRE_TOKENIZERS.get(pre, _gpt2_split)()
        backend.decoder = decoders.ByteLevel()

        control = [t for t, k in zip(tokens, types) if k == TOKEN_TYPE_CONTROL and set(t) <= spelled]
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
        user = [t for t, k in zip(tokens, types) if k == TOKEN_TYPE_USER_DEFINED and t in vocab]
        if user:
            backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])

        special = {i for i, k in enumerate(types) if k == TOKEN_TYPE_CONTROL}
        for key in ("unknown_token_id", "padding_token_id"):
            if metadata.get(f"tokenizer.ggml.{key}") is not None:
                special.add(int(metadata[f"tokenizer.ggml.{key}"]))
        eos = metadata.get("tokenizer.ggml.eos_token_id")
        if eos is None:
            raise ValueError("GGUF metadata has no tokenizer.ggml.eos_token_id")
        return cls(backend, bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"), eos_token_id=int(eos),
                   chat_template=metadata.get("tokenizer.chat_template"),
                   add_bos_token=bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
                   add_eos_token=bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
                   special_ids=special)

    @classmethod
    def from_hf_directory(cls, path: str | Path) -> Tokenizer:
        path = Path(path)
        backend = BackendTokenizer.from_file(str(path / "tokenizer.json"))
        config_file = path / "tokenizer_config.json"
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        template = config.get("chat_template")
        if template is None and (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text()

        def token_id(name: str) -> int | None:
            token = config.get(name)
            if isinstance(token, dict):
                token = token.get("content")
            return backend.token_to_id(token) if token else None

        eos = token_id("eos_token")
        if eos is None:
            model_config = json.loads((path / "config.json").read_text()) if (path / "config.json").is_file() else {}
            eos = model_config.get("eos_token_id")
            eos = eos[0] if isinstance(eos, list) else eos
        if eos is None:
            raise ValueError(f"{path}: cannot tell the end-of-sequence token")
        special = {backend.token_to_id(t.content) for t in backend.get_added_tokens_decoder().values() if t.special}
        byte_level = isinstance(backend.decoder, decoders.ByteLevel)
        return cls(backend, bos_token_id=token_id("bos_token"), eos_token_id=int(eos), chat_template=template,
                   add_bos_token=bool(config.get("add_bos_token", False)),
                   add_eos_token=bool(config.get("add_eos_token", False)),
                   special_ids={i for i in special if i is not None}, byte_level=byte_level)


def load_tokenizer(name_or_path: str) -> Tokenizer:
    """The tokenizer of a registered model name or model path (cached per file; reads no weights)."""
    source = resolve_model(name_or_path)
    return _load_tokenizer(source.kind, source.path)


@lru_cache(maxsize=16)
def _load_tokenizer(kind: str, path: str) -> Tokenizer:
    if kind == "gguf":
        return Tokenizer.from_gguf_metadata(read_gguf_metadata(path))
    if not (Path(path) / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{path} has no tokenizer.json")
    return Tokenizer.from_hf_directory(path)
