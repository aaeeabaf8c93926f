"""What the nesting limit of common.json_body costs against plain `json.loads`.

    python benchmarks/json_body.py [--repeat 20000]

Bodies: a typical 2 KB chat request (a system and a user message: 5 arrays
and objects to walk), a 4 KB one with 70 short messages (72 to walk), a
2.5 MiB single-prompt body (5), and the hostile one: 50,000 nested arrays
(refused). Prints the median per call (µs) of plain `json.loads`, of
what the completion views called before (`json.loads` with `parse_constant`,
which builds a decoder per call) and of `json_loads`; no Django needed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import timeit

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common.json_body import JsonBodyError, json_loads  # noqa: E402


def _chat(messages: list[dict]) -> bytes:
    return json.dumps({"model": "smollm2-135m-instruct", "messages": messages, "max_tokens": 128,
                       "temperature": 0.7, "stream": True, "stream_options": {"include_usage": True}}).encode()


BODIES = {
    "2 KB chat, 2 messages": _chat([{"role": "system", "content": "You are terse. " * 20},
                                    {"role": "user", "content": "Tell me about tea. " * 80}]),
    "4 KB chat, 70 messages": _chat([{"role": ("user", "assistant")[i % 2], "content": "word " * 4}
                                     for i in range(70)]),
    "2.5 MiB prompt": _chat([{"role": "user", "content": "a" * 2_600_000}]),
}
HOSTILE = b"[" * 50_000 + b"]" * 50_000


def _refuse_constant(name: str):
    raise ValueError(name)  # what the completion views passed to json.loads before common.json_body


def _median_us(call, repeat: int) -> float:
    runs = timeit.repeat(call, number=max(1, repeat // 20), repeat=20)
    return statistics.median(runs) / max(1, repeat // 20) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=20_000)
    args = parser.parse_args()
    for name, body in BODIES.items():
        repeat = args.repeat if len(body) < 100_000 else max(20, args.repeat // 1000)
        plain = _median_us(lambda: json.loads(body.decode("utf-8")), repeat)
        before = _median_us(lambda: json.loads(body.decode("utf-8"), parse_constant=_refuse_constant), repeat)
        limited = _median_us(lambda: json_loads(body), repeat)
        print(f"{name:24} {len(body):>9} bytes  json.loads {plain:9.2f} us  before (json.loads with "
              f"parse_constant) {before:9.2f} us  json_loads {limited:9.2f} us  "
              f"vs json.loads {limited - plain:+8.2f} us ({(limited - plain) / plain * 100:+.1f}%)")

    def refused():
        try:
            json_loads(HOSTILE)
        except JsonBodyError:
            return
        raise AssertionError("the hostile body was accepted")

    print(f"{'50,000 nested arrays':24} {len(HOSTILE):>9} bytes  json_loads refuses it in "
          f"{_median_us(refused, 200):.1f} us (json.loads: RecursionError)")


if __name__ == "__main__":
    main()
