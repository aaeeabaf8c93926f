"""Incremental detokenization of generated tokens.

Only generated tokens are decoded (the prompt never leaks into a delta), and
the concatenated deltas, with what `finish()` flushes, equal
`tokenizer.decode(all_generated_tokens)`. A UTF-8 character whose bytes are
split across tokens (common for CJK and emoji) is emitted once complete.

`detokenizer_for` picks one of two:
- `ByteLevelDetokenizer`, for byte-level BPE tokenizers (GPT-2 style: SmolLM2,
  Llama 3, Qwen), whose decoder maps each token to fixed bytes and decodes them
  as UTF-8, invalid bytes replaced: one incremental UTF-8 decoder over the
  tokens' bytes gives the same text, at a table lookup per token.
- `IncrementalDetokenizer`, for any tokenizer: each new token decodes a short
  window, the text of tokens[prefix:] minus the text of tokens[prefix:read];
  while that window ends in U+FFFD nothing is emitted and the window grows.
"""

from __future__ import annotations

import codecs

_REPLACEMENT = "\ufffd"
_utf8_decoder = codecs.getincrementaldecoder("utf-8")


def detokenizer_for(tokenizer, *, skip_special_tokens: bool = True):
    """The detokenizer for one request's generated tokens (see the module docstring)."""
    if getattr(tokenizer, "byte_level", False):
        return ByteLevelDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)
    return IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)


class ByteLevelDetokenizer:
    """Byte-level BPE: each token's bytes through one incremental UTF-8 decoder (errors replaced,
    as the tokenizer's ByteLevel decoder does; an incomplete character waits for its last byte).

    Most tokens are whole characters: while the decoder holds no partial character, such a token's
    text is looked up (`token_text_table`), which is what the decoder would return, at a third of
    its cost (this runs for every sequence every step)."""

    __slots__ = ("_bytes", "_texts", "_skip", "_decoder", "_held")

    def __init__(self, tokenizer, *, skip_special_tokens: bool = True) -> None:
        self._bytes = tokenizer.token_bytes_table()
        self._texts = tokenizer.token_text_table()
        self._skip = tokenizer.skipped_special_ids if skip_special_tokens else frozenset()
        self._decoder = _utf8_decoder(errors="replace")
        self._held = False  # the decoder holds the first bytes of a character

    def add(self, token_id: int) -> str:
        """Append one token; return the newly completed text (possibly empty)."""
        if token_id in self._skip or not 0 <= token_id < len(self._bytes):  # (ids past the vocabulary decode to nothing)
            return ""
        if not self._held:
            text = self._texts[token_id]
            if text is not None:
                return text
        decoder = self._decoder
        text = decoder.decode(self._bytes[token_id])
        self._held = bool(decoder.getstate()[0])
        return text

    def finish(self) -> str:
        """Return the text still held back: an incomplete character at the very end, as U+FFFD."""
        return self._decoder.decode(b"", final=True)


class IncrementalDetokenizer:
    __slots__ = ("tokenizer", "skip_special_tokens", "token_ids", "prefix_offset", "read_offset", "emitted_len",
                 "_decode_ids")

    def __init__(self, tokenizer, *, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        # the `tokenizers` object itself when there is one: add() runs for every token of every request
        backend = getattr(tokenizer, "backend", None)
        self._decode_ids = backend.decode if backend is not None else tokenizer.decode
        self.token_ids: list[int] = []
        self.prefix_offset = 0  # start of the decode window
        self.read_offset = 0  # tokens before this are already emitted
        self.emitted_len = 0  # characters emitted so far

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens) if ids else ""

    def add(self, token_id: int) -> str:
        """Append one token; return the newly completed text (possibly empty)."""
        ids = self.token_ids
        ids.append(token_id)
        start, read, skip = self.prefix_offset, self.read_offset, self.skip_special_tokens
        prefix_text = self._decode_ids(ids[start:read], skip_special_tokens=skip) if read > start else ""
        new_text = self._decode_ids(ids[start:], skip_special_tokens=skip)
        if len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT):
            return ""
        delta = new_text[len(prefix_text):]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.token_ids)
        self.emitted_len += len(delta)
        return delta

    def finish(self) -> str:
        """Return the text still held back (e.g. an incomplete character at the very end)."""
        if self.read_offset == len(self.token_ids):
            return ""
        full = self._decode(self.token_ids)
        rest = full[self.emitted_len:]
        self.read_offset = self.prefix_offset = len(self.token_ids)
        self.emitted_len = len(full)
        return rest
