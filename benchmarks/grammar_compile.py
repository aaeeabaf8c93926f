"""Grammar libraries for structured outputs, measured on our own tokenizer: xgrammar and llguidance side by side.

For each typical JSON schema (tests/engine/structured_schemas.py: nested objects, arrays, enums, optional
fields, bounded numbers, $defs/$ref, a recursive tree) and for json_object:

- compile, cold: schema -> a matcher ready to give its first mask, no cache (xgrammar compiles eagerly: its
  token-mask cache for the whole vocabulary; llguidance builds its lexer lazily, so its first mask is where
  that work is done, and is counted here);
- warm: a fresh matcher for a schema seen before (xgrammar: its compiler's cache; llguidance: a copy of a
  cached matcher, what inference.engine.structured keeps);
- per-step mask fill for a batch of 64 sequences (each row walks a valid instance of one schema, token by
  token, and its token is checked against the mask), with each library's batched fill, and the per-step
  cost of advancing the 64 matchers;
- the JSON-schema features each one enforces: a valid document accepted (then EOS), an invalid one
  rejected ("ignored": both accepted; "error": not compiled).

The vocabulary is our GGUF tokenizer's (inference.engine.tokenizer): each token's raw bytes, special tokens
other than EOS made unreachable; a round trip checks the library decodes our ids to our bytes.

    python benchmarks/grammar_compile.py [--reps 20] [--steps 200] [--batch 64] [--json]

llguidance is a dependency; xgrammar is not (`pip install xgrammar==0.2.8` to compare: it brings no other
torch); without it the script measures llguidance alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.engine.structured_schemas import FEATURES, TYPICAL, feature_instances  # noqa: E402

SEPARATORS = (", ", ": ")  # json.dumps's; the grammar allows no other whitespace


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class XGrammar:
    name = "xgrammar"

    def __init__(self, tok, threads: int) -> None:
        import xgrammar as xgr

        self.xgr, self.tok = xgr, tok
        vocab = [b"" if i in tok.all_special_ids and i != tok.eos_token_id else b
                 for i, b in enumerate(tok.token_bytes_table())]
        self.info = xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=len(vocab),
                                      stop_token_ids=[tok.eos_token_id])
        self.cold = xgr.GrammarCompiler(self.info, max_threads=threads, cache_enabled=False)
        self.warm = xgr.GrammarCompiler(self.info, max_threads=threads)
        self.batch = xgr.BatchGrammarMatcher(max_threads=threads)
        self.version = xgr.__version__ if hasattr(xgr, "__version__") else "0.2.8"

    def _compile(self, compiler, schema):
        if schema is None:
            return compiler.compile_json_schema('{"type": "object"}', any_whitespace=False, separators=SEPARATORS,
                                                strict_mode=False)
        return compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=SEPARATORS)

    def cold_matcher(self, schema):
        m = self.xgr.GrammarMatcher(self._compile(self.cold, schema))
        m.fill_next_token_bitmask(self.bitmask(1))
        return m

    def warm_matcher(self, schema):
        return self.xgr.GrammarMatcher(self._compile(self.warm, schema))

    def bitmask(self, n):
        return self.xgr.allocate_token_bitmask(n, self.tok.vocab_size)

    def fill(self, matchers, bitmask):
        self.batch.batch_fill_next_token_bitmask(matchers, bitmask)

    def accept(self, m, token) -> bool:
        return m.accept_token(token)

    def roundtrip(self, ids) -> bytes:
        return b"".join(self.tok.token_bytes_table()[i] for i in ids)  # xgrammar's vocab is ours, byte for byte


class _Wrapped:
    """Our tokenizer as llguidance's TokenizerWrapper reads one: raw token bytes, special ids, an encoder."""

    def __init__(self, tok) -> None:
        self.tok, self.tokens = tok, tok.token_bytes_table()
        self.eos_token_id, self.bos_token_id = tok.eos_token_id, tok.bos_token_id
        self.special_token_ids = list(tok.all_special_ids)

    def __call__(self, text):
        return self.tok.encode(text.decode("utf-8", "replace") if isinstance(text, bytes) else text)


class LLGuidance:
    name = "llguidance"

    def __init__(self, tok, threads: int) -> None:
        import llguidance
        import llguidance.torch as llt

        self.ll, self.llt, self.tok = llguidance, llt, tok
        self.tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Wrapped(tok)), n_vocab=tok.vocab_size)
        self.executor = llguidance.LLExecutor(num_threads=threads)
        self.cache: dict[str, object] = {}
        self.version = llguidance.get_version() if hasattr(llguidance, "get_version") else "1.9.1"

    def _grammar(self, schema):
        options = {"whitespace_flexible": False, "item_separator": SEPARATORS[0], "key_separator": SEPARATORS[1]}
        return self.ll.LLMatcher.grammar_from_json_schema(schema if schema is not None else {"type": "object"},
                                                          defaults=options)

    def cold_matcher(self, schema):
        m = self.ll.LLMatcher(self.tokenizer, self._grammar(schema), log_level=0)
        if m.is_error():
            raise ValueError(m.get_error())
        self.llt.fill_next_token_bitmask(m, self.bitmask(1), 0)
        return m

    def warm_matcher(self, schema):
        key = json.dumps(schema, sort_keys=True)
        if key not in self.cache:
            self.cache[key] = self.cold_matcher(schema)
            self.cache[key].reset()
        return self.cache[key].deep_copy()

    def bitmask(self, n):
        return self.llt.allocate_token_bitmask(n, self.tok.vocab_size)

    def fill(self, matchers, bitmask):
        self.llt.fill_next_token_bitmask_par(self.executor, [(m, i) for i, m in enumerate(matchers)], bitmask)

    def accept(self, m, token) -> bool:
        return m.consume_token(token)

    def roundtrip(self, ids) -> bytes:
        return self.tokenizer.decode_bytes(ids)


def compile_times(lib, reps: int) -> dict:
    out = {}
    for name, (schema, _) in TYPICAL.items():
        cold, warm = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            lib.cold_matcher(schema)
            cold.append(time.perf_counter() - t0)
        lib.warm_matcher(schema)
        for _ in range(reps):
            t0 = time.perf_counter()
            lib.warm_matcher(schema)
            warm.append(time.perf_counter() - t0)
        out[name] = {"cold": cold, "warm": warm}
    return out


def _allowed(bitmask, row: int, token: int) -> bool:
    return bool((int(bitmask[row, token // 32]) >> (token % 32)) & 1)


def mask_steps(lib, tok, batch: int, steps: int) -> dict:
    """`steps` steps of `batch` rows, each walking a valid instance of one schema (restarted when done)."""
    docs = list(TYPICAL.items())
    walks = [(schema, tok.encode(json.dumps(doc)) + [tok.eos_token_id]) for _, (schema, doc) in docs]
    rows = [[lib.warm_matcher(walks[i % len(walks)][0]), i % len(walks), 0] for i in range(batch)]
    bitmask = lib.bitmask(batch)
    fill_s, accept_s, violations = [], [], 0
    for _ in range(steps):
        t0 = time.perf_counter()
        lib.fill([r[0] for r in rows], bitmask)
        t1 = time.perf_counter()
        for i, row in enumerate(rows):
            matcher, w, pos = row
            token = walks[w][1][pos]
            violations += not _allowed(bitmask, i, token)
            violations += not lib.accept(matcher, token)
            row[2] = pos + 1
        t2 = time.perf_counter()
        for row in rows:
            if row[2] == len(walks[row[1]][1]):
                row[0], row[2] = lib.warm_matcher(walks[row[1]][0]), 0
        fill_s.append(t1 - t0)
        accept_s.append(t2 - t1)
    return {"fill": fill_s, "accept": accept_s, "violations": violations}


def _walk(lib, matcher, ids) -> bool:
    return all(lib.accept(matcher, t) for t in ids)


def features(lib, tok) -> dict:
    out = {}
    for name, (schema, _, _) in FEATURES.items():
        good, bad = feature_instances(name)
        try:
            m = lib.cold_matcher(schema)
        except Exception as exc:  # noqa: BLE001 - a feature the library refuses
            out[name] = f"error: {str(exc).splitlines()[0][:60]}"
            continue
        ok = _walk(lib, m, tok.encode(json.dumps(good)) + [tok.eos_token_id])
        rejected = not _walk(lib, lib.cold_matcher(schema), tok.encode(json.dumps(bad)) + [tok.eos_token_id])
        out[name] = "enforced" if ok and rejected else "ignored" if ok else "rejects valid"
    return out


def measure(lib, tok, args) -> dict:
    sample = tok.encode('{"naïve": "日本 🙂", "n": [1, -2.5e3]}')
    assert lib.roundtrip(sample) == tok.decode(sample).encode("utf-8"), "the library's vocabulary is not ours"
    times = compile_times(lib, args.reps)
    steps = mask_steps(lib, tok, args.batch, args.steps)
    return {"version": lib.version, "compile": times, "steps": steps, "features": features(lib, tok)}


def report(results: dict, args) -> None:
    libs = list(results)
    print(f"compile (ms): p50/p95 over {args.reps} runs; cold = schema -> first mask, warm = cached")
    print(f"{'schema':<12}" + "".join(f"{lib + ' cold':>24}{lib + ' warm':>22}" for lib in libs))
    for schema in TYPICAL:
        cells = []
        for lib in libs:
            c = results[lib]["compile"][schema]
            cells.append(f"{_pct(c['cold'], .5) * 1e3:>13.2f} /{_pct(c['cold'], .95) * 1e3:>8.2f}"
                         f"{_pct(c['warm'], .5) * 1e3:>13.3f} /{_pct(c['warm'], .95) * 1e3:>7.3f}")
        print(f"{schema:<12}" + "".join(cells))
    for lib in libs:
        allc = [x for c in results[lib]["compile"].values() for x in c["cold"]]
        allw = [x for c in results[lib]["compile"].values() for x in c["warm"]]
        s = results[lib]["steps"]
        print(f"{lib} {results[lib]['version']}: all schemas cold p50 {_pct(allc, .5) * 1e3:.2f} ms p95 "
              f"{_pct(allc, .95) * 1e3:.2f} ms, warm p50 {_pct(allw, .5) * 1e3:.3f} ms p95 {_pct(allw, .95) * 1e3:.3f}"
              f" ms; batch {args.batch} mask fill p50 {_pct(s['fill'], .5) * 1e3:.2f} ms p95 "
              f"{_pct(s['fill'], .95) * 1e3:.2f} ms, advance p50 {_pct(s['accept'], .5) * 1e3:.2f} ms; "
              f"tokens outside the mask or refused: {s['violations']}")
    print(f"\n{'feature':<30}" + "".join(f"{lib:>22}" for lib in libs))
    for name in FEATURES:
        print(f"{name:<30}" + "".join(f"{results[lib]['features'][name]:>22}" for lib in libs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", choices=["xgrammar", "llguidance"])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from inference.engine.tokenizer import load_tokenizer

    tok = load_tokenizer(args.model)
    libs = []
    for cls in (XGrammar, LLGuidance):
        if args.only in (None, cls.name):
            try:
                libs.append(cls(tok, args.threads))
            except ImportError as exc:
                print(f"{cls.name} not installed ({exc}): skipped", file=sys.stderr)
    results = {lib.name: measure(lib, tok, args) for lib in libs}
    if args.json:
        summary = {lib: {"version": r["version"], "features": r["features"], "violations": r["steps"]["violations"],
                         "compile_ms": {s: {k: [_pct(v, .5) * 1e3, _pct(v, .95) * 1e3] for k, v in c.items()}
                                        for s, c in r["compile"].items()},
                         "fill_ms": [_pct(r["steps"]["fill"], .5) * 1e3, _pct(r["steps"]["fill"], .95) * 1e3],
                         "advance_ms": [_pct(r["steps"]["accept"], .5) * 1e3, _pct(r["steps"]["accept"], .95) * 1e3]}
                   for lib, r in results.items()}
        print(json.dumps({"batch": args.batch, "steps": args.steps, "reps": args.reps, "results": summary}, indent=1))
    else:
        report(results, args)


if __name__ == "__main__":
    main()
