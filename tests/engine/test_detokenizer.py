"""Incremental detokenizer on the real SmolLM2 tokenizer (metadata only, no weights)."""

import pytest

from inference.engine.detokenizer import IncrementalDetokenizer
from inference.engine.tokenizer import load_tokenizer

TEXTS = [
    "Hello, world! How are you today?",
    "你好，世界。今天天气很好，我们去公园散步吧。",
    "Emoji time 🙂🚀👩‍👩‍👧 and flags 🇫🇷🇯🇵 end",
    "Accents: café, naïve, São Paulo, Ærøskøbing, Straße",
    "def f(x):\n    return x  *  2\n\n\tprint('done')   \n",
    "日本語とEnglishの混在テキスト🎌 with numbers 12345",
    "한국어 문장입니다. Ελληνικά κείμενα. Русский текст.",
]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("smollm2-135m-instruct")


def stream(tokenizer, ids, skip_special_tokens=True):
    detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=skip_special_tokens)
    deltas = [detok.add(t) for t in ids]
    deltas.append(detok.finish())
    return deltas


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_concatenate_to_the_full_decode_without_replacement_chars(tokenizer, text):
    ids = tokenizer.encode(text)
    deltas = stream(tokenizer, ids)
    assert "".join(deltas) == tokenizer.decode(ids) == text
    assert not any("\ufffd" in d for d in deltas)


def test_split_multibyte_characters_wait_for_their_last_byte(tokenizer):
    ids = tokenizer.encode("你好🙂")
    assert len(ids) > 3  # these characters really are split across tokens
    deltas = stream(tokenizer, ids)
    assert [d for d in deltas if d] == ["你", "好", "🙂"]


def test_special_tokens_are_skipped_or_kept(tokenizer):
    ids = tokenizer.encode("Hi") + [tokenizer.eos_token_id] + tokenizer.encode(" there")
    assert "".join(stream(tokenizer, ids)) == "Hi there"
    kept = "".join(stream(tokenizer, ids, skip_special_tokens=False))
    assert kept == tokenizer.decode(ids, skip_special_tokens=False) and "<|im_end|>" in kept


def test_invalid_utf8_at_the_end_is_flushed_like_the_full_decode(tokenizer):
    ids = tokenizer.encode("ok 🙂")[:-1]  # cut the emoji in half: the full decode has U+FFFD
    deltas = stream(tokenizer, ids)
    assert "".join(deltas) == tokenizer.decode(ids)
    assert "\ufffd" not in "".join(deltas[:-1])  # only the final flush carries it
