"""SentencePiece vocabularies in a GGUF (`tokenizer.ggml.model == "llama"`), rebuilt with `tokenizers`.

The file holds the pieces (`▁` stands for a space), their scores and token types: 1 normal, 2 unknown,
3 control (`<bos>`, `<start_of_turn>`), 4 user-defined (`\\n`, `<table>`), 6 byte (`<0x0A>`). There are no
merges; a BPE with byte fallback over merges derived from the vocabulary gives SentencePiece's result
(as transformers' GGUF loader does it, our reference):

- Gemma (`general.architecture` gemma*): spaces become `▁` (a normalizer, no prefix space); a piece of
  two or more spaces is stored as real spaces and is re-spelled with `▁`; the merges follow the order of
  the pieces in the file (Gemma's scores do not follow its merge order).
- Any other model (Llama 2, Mistral...): `Metaspace` adds one `▁` before the text when
  `tokenizer.ggml.add_space_prefix` (default true) and decoding strips it again; merges are ranked by score.

Control tokens (and BOS/EOS/UNK/PAD) are special tokens: matched whole and skipped by
`decode(skip_special_tokens=True)`; user-defined ones are plain added tokens. `token_bytes` of a piece is
its text with `▁` as a space, of `<0xNN>` the byte NN: with no prefix space to strip, a decoded text is its
tokens' bytes as UTF-8, so the tokenizer is `byte_level` and streams through the byte detokenizer.
"""

from __future__ import annotations

import re

from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as BackendTokenizer

SPACE = "\u2581"
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_BYTE = 6
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_SPECIAL_ID_KEYS = ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id")


def is_gemma(metadata: dict) -> bool:
    return str(metadata.get("general.architecture", "")).startswith("gemma")


def respell_spaces(tokens: list[str]) -> list[str]:
    """Gemma stores a piece of spaces as real spaces ("  "); the normalized text spells them "▁▁"."""
    return [SPACE * len(t) if " " in t and not t.strip() else t for t in tokens]


def derive_merges(tokens: list[str], ranks: list[float]) -> list[tuple[str, str]]:
    """The merges a vocabulary implies: every split of a piece into two pieces of the vocabulary, best piece
    (highest rank) first, then the longer left part (transformers' `generate_merges`, with its tie order)."""
    vocab = {token: index for index, token in enumerate(tokens)}
    rank_of = dict(zip(tokens, ranks))
    found: list[tuple[str, str, float]] = []
    for piece, rank in rank_of.items():
        local = [(piece[:i], piece[i:], rank) for i in range(1, len(piece))
                 if piece[:i] in vocab and piece[i:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        found.extend(local)
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in found]


def _merges(metadata: dict, tokens: list[str], gemma: bool) -> list[tuple[str, str]]:
    if metadata.get("tokenizer.ggml.merges"):
        return [tuple(m.split(" ", 1)) for m in metadata["tokenizer.ggml.merges"]]
    if gemma:
        return derive_merges(tokens, [-float(i) for i in range(len(tokens))])
    scores = metadata.get("tokenizer.ggml.scores") or [-float(i) for i in range(len(tokens))]
    return derive_merges(tokens, list(scores))


def _pipeline(backend: BackendTokenizer, gemma: bool, prefix_space: bool) -> None:
    """Normalizer, pre-tokenizer and decoder: spaces to `▁` and back, byte pieces to bytes."""
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:
        backend.normalizer = normalizers.Replace(" ", SPACE)
        backend.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    else:
        backend.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement=SPACE, prepend_scheme="first" if prefix_space else "never", split=False)
        if prefix_space:
            steps.append(decoders.Strip(content=" ", left=1))
    backend.decoder = decoders.Sequence(steps)


def special_token_ids(metadata: dict, types: list[int]) -> set[int]:
    ids = {i for i, kind in enumerate(types) if kind == TOKEN_TYPE_CONTROL}
    ids.update(int(metadata[f"tokenizer.ggml.{key}"]) for key in _SPECIAL_ID_KEYS
               if metadata.get(f"tokenizer.ggml.{key}") is not None)
    return ids


def _add_tokens(backend: BackendTokenizer, tokens: list[str], spelled: list[str], types: list[int],
                special: set[int]) -> None:
    backend.add_special_tokens([AddedToken(spelled[i], special=True, normalized=False) for i in sorted(special)])
    vocab = set(spelled)  # (as transformers: a user-defined piece the re-spelling changed stays a plain piece)
    user = [t for t, kind in zip(tokens, types) if kind == TOKEN_TYPE_USER_DEFINED and t in vocab]
    if user:
        backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])


def token_bytes_table(spelled: list[str], types: list[int]) -> list[bytes]:
    """Each id's bytes: `<0xNN>` byte pieces the byte NN, any other piece its text with `▁` as a space
    (a special token its own text, as `decode(..., skip_special_tokens=False)` gives it)."""
    table = []
    for piece, kind in zip(spelled, types):
        match = _BYTE_PIECE.fullmatch(piece) if kind == TOKEN_TYPE_BYTE else None
        table.append(bytes([int(match.group(1), 16)]) if match else piece.replace(SPACE, " ").encode("utf-8"))
    return table


def spm_tokenizer_parts(metadata: dict) -> dict:
    """The keyword arguments of `Tokenizer(...)` for a SentencePiece GGUF vocabulary."""
    tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
    types: list[int] = list(metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    gemma = is_gemma(metadata)
    spelled = respell_spaces(tokens) if gemma else tokens
    prefix_space = not gemma and bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    unk_id = metadata.get("tokenizer.ggml.unknown_token_id")
    unk = spelled[int(unk_id)] if unk_id is not None else None
    vocab = {token: index for index, token in enumerate(spelled)}
    backend = BackendTokenizer(models.BPE(vocab=vocab, merges=_merges(metadata, spelled, gemma), unk_token=unk,
                                          fuse_unk=True, byte_fallback=True))
    _pipeline(backend, gemma, prefix_space)
    special = special_token_ids(metadata, types)
    _add_tokens(backend, tokens, spelled, types, special)
    eos = metadata.get("tokenizer.ggml.eos_token_id")
    if eos is None:
        raise ValueError("GGUF metadata has no tokenizer.ggml.eos_token_id")
    table = token_bytes_table(spelled, types)
    table.extend(b"" for _ in range(backend.get_vocab_size(with_added_tokens=True) - len(table)))
    return dict(backend=backend, bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"), eos_token_id=int(eos),
                chat_template=metadata.get("tokenizer.chat_template"),
                # llama.cpp adds BOS to a SentencePiece vocabulary that does not say otherwise
                add_bos_token=bool(metadata.get("tokenizer.ggml.add_bos_token", True)),
                add_eos_token=bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
                special_ids=special, byte_level=not prefix_space, token_bytes=table)
