"""Forward-pass timings of the model alone (no scheduler, sampler or detokenizer).

    .venv/bin/python benchmarks/model_forward.py [--dtype bfloat16] [--no-int4] [--json]

Measures a 512-token prefill (one sequence, logits for its last token), and one
decode step at batch 1 (context 512) and at batch 64 (context 300 each), each
with logits for every sequence. KV blocks are scattered like a real cache.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _runtime import runtime_configure_from_env  # noqa: E402

from inference.engine.attention_metadata import AttentionMetadata  # noqa: E402
from inference.engine.kv_cache import allocate_kv_caches  # noqa: E402
from inference.engine.loader import load_model  # noqa: E402

BLOCK = 16


def _metadata(q_lens: list[int], ctx_lens: list[int], order: torch.Tensor) -> tuple[AttentionMetadata, torch.Tensor]:
    """Sequences with ctx_lens[b] tokens after this step, q_lens[b] of them new; blocks from `order`."""
    tables, slots, positions, next_block = [], [], [], 0
    for q_len, ctx in zip(q_lens, ctx_lens):
        count = -(-ctx // BLOCK)
        table = order[next_block:next_block + count].tolist()
        next_block += count
        tables.append(table)
        for pos in range(ctx - q_len, ctx):
            slots.append(table[pos // BLOCK] * BLOCK + pos % BLOCK)
            positions.append(pos)
    width = max(len(t) for t in tables)
    starts = [0]
    for q_len in q_lens:
        starts.append(starts[-1] + q_len)
    meta = AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(ctx_lens, dtype=torch.int32),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        max_query_len=max(q_lens), max_seq_len=max(ctx_lens), decode_only=max(q_lens) == 1)
    return meta, torch.tensor(positions, dtype=torch.int64)


def _time(fn, repeats: int) -> tuple[float, float]:
    """(best, median) seconds; the best is the figure least disturbed by other load on the machine."""
    fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return min(samples), statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--no-int4", action="store_true", help="dense weights only, also for decode")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runtime_configure_from_env()

    loaded = load_model(args.model, dtype=args.dtype, device="cpu", int4_decode=not args.no_int4)
    model, vocab = loaded.model, loaded.config.vocab_size
    num_blocks = 64 * (-(-300 // BLOCK)) + 64
    caches = allocate_kv_caches(loaded.config, num_blocks, BLOCK, loaded.dtype, "cpu")
    order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(0))
    results = {"threads": torch.get_num_threads(), "dtype": args.dtype, "int4_decode": not args.no_int4,
               "load_avg_1m": round(os.getloadavg()[0], 2)}

    def case(name: str, q_lens: list[int], ctx_lens: list[int], logit_rows: list[int]) -> None:
        meta, positions = _metadata(q_lens, ctx_lens, order)
        ids = torch.randint(0, vocab, (positions.numel(),))
        rows = torch.tensor(logit_rows)

        @torch.inference_mode()
        def step():
            model.compute_logits(model(ids, positions, meta, caches)[rows])

        best, median = _time(step, args.repeats)
        results[name] = {"best_ms": round(best * 1e3, 2), "median_ms": round(median * 1e3, 2),
                         "tok_s": round(sum(q_lens) / best, 1)}

    case("prefill_512", [512], [512], [511])
    case("decode_b1_ctx512", [1], [512], [0])
    case("decode_b64_ctx300", [1] * 64, [300] * 64, list(range(64)))
    if args.json:
        print(json.dumps(results))
    else:
        for key, value in results.items():
            print(f"{key:>20}: {value}")


if __name__ == "__main__":
    main()
