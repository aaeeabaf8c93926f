"""Both detokenizers on the real SmolLM2 tokenizer (metadata only, no weights)."""

import random

import pytest

from inference.engine.detokenizer import ByteLevelDetokenizer, IncrementalDetokenizer, detokenizer_for
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


@pytest.fixture(params=[IncrementalDetokenizer, ByteLevelDetokenizer], ids=["window", "byte-level"])
def stream(request):
    """stream(tokenizer, ids, skip_special_tokens=True) -> the deltas, then what finish() flushed."""
    detokenizer = request.param

    def run(tokenizer, ids, skip_special_tokens=True):
        detok = detokenizer(tokenizer, skip_special_tokens=skip_special_tokens)
        deltas = [detok.add(t) for t in ids]
        deltas.append(detok.finish())
        return deltas

    return run


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_concatenate_to_the_full_decode_without_replacement_chars(tokenizer, stream, text):
    ids = tokenizer.encode(text)
    deltas = stream(tokenizer, ids)
    assert "".join(deltas) == tokenizer.decode(ids) == text
    assert not any("\ufffd" in d for d in deltas)


def test_split_multibyte_characters_wait_for_their_last_byte(tokenizer, stream):
    ids = tokenizer.encode("你好🙂")
    assert len(ids) > 3  # these characters really are split across tokens
    deltas = stream(tokenizer, ids)
    assert [d for d in deltas if d] == ["你", "好", "🙂"]


def test_special_tokens_are_skipped_or_kept(tokenizer, stream):
    ids = tokenizer.encode("Hi") + [tokenizer.eos_token_id] + tokenizer.encode(" there")
    assert "".join(stream(tokenizer, ids)) == "Hi there"
    kept = "".join(stream(tokenizer, ids, skip_special_tokens=False))
    assert kept == tokenizer.decode(ids, skip_special_tokens=False) and "<|im_end|>" in kept


def test_invalid_utf8_at_the_end_is_flushed_like_the_full_decode(tokenizer, stream):
    ids = tokenizer.encode("ok 🙂")[:-1]  # cut the emoji in half: the full decode has U+FFFD
    deltas = stream(tokenizer, ids)
    assert "".join(deltas) == tokenizer.decode(ids)
    assert "\ufffd" not in "".join(deltas[:-1])  # only the final flush carries it


@pytest.mark.parametrize("skip", [True, False])
def test_random_token_sequences_decode_as_the_tokenizer_does(tokenizer, stream, skip):
    """Any ids, special ones, lone bytes and broken UTF-8 included: the same text as `decode`."""
    rng = random.Random(1234)
    table = tokenizer.token_bytes_table()
    lone_bytes = [i for i, piece in enumerate(table) if len(piece) == 1 and piece[0] >= 0x80]
    specials = sorted(tokenizer.skipped_special_ids)
    assert lone_bytes and specials
    for _ in range(200):
        ids = [rng.choice((rng.randrange(tokenizer.vocab_size), rng.choice(lone_bytes), rng.choice(lone_bytes),
                           rng.choice(specials))) for _ in range(rng.randrange(1, 24))]
        assert "".join(stream(tokenizer, ids, skip_special_tokens=skip)) == tokenizer.decode(ids, skip_special_tokens=skip)


def test_the_byte_level_tokenizer_gets_the_byte_level_detokenizer(tokenizer):
    assert isinstance(detokenizer_for(tokenizer), ByteLevelDetokenizer)

    class WordLevel:  # any other tokenizer: the window over `decode`
        byte_level = False

        def decode(self, ids, skip_special_tokens=True):
            return " ".join(f"w{i}" for i in ids)

    detok = detokenizer_for(WordLevel())
    assert isinstance(detok, IncrementalDetokenizer)
    assert "".join([detok.add(1), detok.add(2), detok.finish()]) == "w1 w2"


def test_ids_past_the_vocabulary_decode_to_nothing(tokenizer):
    detok = ByteLevelDetokenizer(tokenizer)
    assert detok.add(tokenizer.vocab_size + 5) == "" and detok.add(-1) == ""
    assert detok.add(tokenizer.encode("ok")[0]) == "ok"
