"""Detokenizing generated tokens: microseconds per token, the two detokenizers in one run.

Every engine step turns each running request's new token into text (host work
that, on a GPU, sits between the model's steps or overlaps them). This streams
a mixed text (English, code, CJK, emoji; SmolLM2's byte-level BPE by default)
token by token through:

- `IncrementalDetokenizer`: two `tokenizers` decodes of a short window per token;
- `ByteLevelDetokenizer`: the token's bytes through one incremental UTF-8 decoder;

and checks that both give `tokenizer.decode` of the whole sequence.

    python benchmarks/detokenizer.py
    python benchmarks/detokenizer.py --model smollm2-135m-instruct --tokens 20000 --rounds 7 --json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _compare import medians_against  # noqa: E402

TEXT = (
    "The quick brown fox jumps over the lazy dog, then writes a short story about it. "
    "def area(r):\n    return 3.14159 * r ** 2\n\n"
    "今天天气很好，我们去公园散步吧。東京と大阪の天気予報。 "
    "Emoji 🙂🚀👩‍👩‍👧 and accents: café, naïve, Straße. "
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--tokens", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from inference.engine.detokenizer import ByteLevelDetokenizer, IncrementalDetokenizer
    from inference.engine.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(args.model)
    tokenizer.token_text_table()  # the tables the byte-level detokenizer reads, built before any timing
    unit = tokenizer.encode(TEXT)
    ids = (unit * (args.tokens // len(unit) + 1))[: args.tokens]
    expected = tokenizer.decode(ids)
    kinds = {"window (IncrementalDetokenizer)": IncrementalDetokenizer,
             "byte-level (ByteLevelDetokenizer)": ByteLevelDetokenizer}
    samples: dict[str, list[float]] = {name: [] for name in kinds}
    for _ in range(args.rounds):
        for name, kind in kinds.items():
            detok = kind(tokenizer)
            started = time.perf_counter()
            text = "".join([detok.add(token) for token in ids]) + detok.finish()
            samples[name].append((time.perf_counter() - started) / len(ids) * 1e6)
            if text != expected:
                raise SystemExit(f"{name}: the text differs from tokenizer.decode")
    medians, speedup = medians_against(samples, "window (IncrementalDetokenizer)", unit="us/token")
    report = {"model": args.model, "tokens": len(ids), "rounds": args.rounds, "us_per_token": medians,
              "speedup": speedup}
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
