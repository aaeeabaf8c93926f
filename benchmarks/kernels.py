"""Kernel benchmark: each Triton kernel against its PyTorch reference (and, for
attention, against torch's scaled_dot_product_attention on pre-gathered dense
K/V), reported as time and achieved bandwidth next to the measured copy
bandwidth of the device.

    python benchmarks/kernels.py                 # CUDA if present, else CPU
    python benchmarks/kernels.py --device cpu    # the references only
    python benchmarks/kernels.py --json          # last line: one JSON object
    python benchmarks/kernels.py --device cpu --decode-only --threads 1 --cpu-time

On CUDA the timings come from triton.testing.do_bench (median); the Triton and
SDPA rows replay a CUDA graph of the call (do_bench_cudagraph), as the engine's
decode steps do, so the Python launcher's time is left out. On the CPU
there is no Triton backend to time (the interpreter is for tests), so the CPU
production path is measured: the PyTorch references and the native C decode
attention (``kernels/paged_decode_attention_cpu.py``, at batch 1/16/64 and
contexts 128/512/1024 next to its reference), with medians of
time.perf_counter over repeated calls. Bandwidth is the K/V (and q/out) bytes
an op must move over its time, next to the measured copy bandwidth (a 256 MB
``Tensor.copy_``, read + write counted) of the same run.

``mixed_step_attention`` rows time one attention layer on a mixed step (decodes
plus whole prompts) both ways: every row through the prefill kernel, and the
decodes split off to the decode kernel (what the model runner arranges now);
the former is the peer.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from _runtime import runtime_configure_from_env  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from kernels import activation, kv_store, paged_decode_attention as pda  # noqa: E402
from kernels import prefill_attention as pfa, rms_norm as rms, rotary, rotary_kv_store as rkv  # noqa: E402
from kernels import cpu_native  # noqa: E402
from kernels.cpu_allocator import tune_cpu_allocator  # noqa: E402
from kernels.paged_decode_attention_cpu import paged_decode_attention_cpu  # noqa: E402
from tests.kernels.paged_cases import make_paged_case  # noqa: E402

SHAPES = {  # (Hq, Hkv, D)
    "smollm2-135m": (9, 3, 64),
    "llama-3.2-1b": (32, 8, 64),
}


@dataclass
class Row:
    op: str
    case: str
    impl: str
    timing: tuple[float, float]  # (median ms, best ms)
    gbytes: float

    @property
    def ms(self) -> float:
        return self.timing[0]

    @property
    def best_ms(self) -> float:
        return self.timing[1]

    @property
    def gb_s(self) -> float:
        return self.gbytes / (self.ms / 1e3) if self.ms > 0 else 0.0


CLOCK = time.perf_counter  # --cpu-time: time.process_time (CPU seconds; use with --threads 1)


def time_ms(fn: Callable[[], object], device: torch.device, reps: int, graph: bool = False) -> tuple[float, float]:
    """(median, best) milliseconds per call.

    ``graph``: on CUDA, time replays of a CUDA graph of ``fn`` (how the engine runs decode steps), so the
    Python launcher's own time is left out; only for functions without host syncs."""
    if device.type == "cuda":
        from triton.testing import do_bench, do_bench_cudagraph

        if graph:
            fn()  # compile outside the capture
            return (float(do_bench_cudagraph(fn, rep=100, return_mode="median")),
                    float(do_bench_cudagraph(fn, rep=50, return_mode="min")))
        return (float(do_bench(fn, warmup=25, rep=100, return_mode="median")),
                float(do_bench(fn, warmup=5, rep=50, return_mode="min")))
    for _ in range(3):
        fn()
    samples = []
    for _ in range(reps):
        start = CLOCK()
        fn()
        samples.append((CLOCK() - start) * 1e3)
    return statistics.median(samples), min(samples)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def copy_bandwidth(device: torch.device, reps: int) -> float:
    """GB/s of a large device-to-device copy (read + write counted)."""
    n = (512 << 20) // 4 if device.type == "cuda" else (256 << 20) // 4
    src = torch.empty(n, dtype=torch.float32, device=device).normal_()
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), device, reps)[1]
    return 2 * src.numel() * 4 / (ms / 1e3) / 1e9


def attention_rows(device, dtype, model, batch, ctx, mixed, with_triton, reps, with_native=False,
                   with_dense=True) -> list[Row]:
    hq, hkv, dim = SHAPES[model]
    gen = torch.Generator().manual_seed(0)
    lens = (torch.randint(ctx // 4, ctx + 1, (batch,), generator=gen).tolist() if mixed
            else [ctx] * batch)
    case = make_paged_case([1] * batch, lens, hq, hkv, dim, 16, dtype, device)
    esize = torch.empty((), dtype=dtype).element_size()
    gbytes = (2 * sum(lens) * hkv * dim + 2 * batch * hq * dim) * esize / 1e9
    args = (case.q, case.k_cache, case.v_cache, case.block_tables, case.seq_lens, case.scale)
    label = f"{model} B={batch} ctx={'%d-%d' % (ctx // 4, ctx) if mixed else ctx}"
    rows = [Row("decode_attention", label, "ref", time_ms(lambda: pda.paged_decode_attention_ref(*args), device, reps), gbytes)]
    if with_triton:
        rows.append(Row("decode_attention", label, "triton",
                        time_ms(lambda: pda.paged_decode_attention(*args), device, reps, graph=True), gbytes))
    if with_native:
        rows.append(Row("decode_attention", label, "native (C)",
                        time_ms(lambda: paged_decode_attention_cpu(*args), device, reps), gbytes))
    if not with_dense:
        return rows
    # SDPA on dense, already gathered K/V (no paging cost at all): a lower bound.
    keys, values = pda.gather_padded_kv(case.k_cache, case.v_cache, case.block_tables, -(-max(lens) // 16))
    keys, values = keys.transpose(1, 2).contiguous(), values.transpose(1, 2).contiguous()
    pos = torch.arange(keys.shape[2], device=device)
    mask = (pos.view(1, -1) < case.seq_lens.view(-1, 1)).view(batch, 1, 1, -1)
    query = case.q.view(batch, hq, 1, dim)
    rows.append(Row("decode_attention", label, "torch sdpa (dense K/V)", time_ms(
        lambda: F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, scale=case.scale,
                                               enable_gqa=True), device, reps, graph=True), gbytes))
    return rows


def prefill_rows(device, dtype, model, q_lens, seq_lens, with_triton, reps) -> list[Row]:
    hq, hkv, dim = SHAPES[model]
    case = make_paged_case(q_lens, seq_lens, hq, hkv, dim, 16, dtype, device)
    esize = torch.empty((), dtype=dtype).element_size()
    gbytes = (2 * sum(seq_lens) * hkv * dim + 2 * sum(q_lens) * hq * dim) * esize / 1e9
    args = (case.q, case.k_cache, case.v_cache, case.block_tables, case.query_start_loc,
            case.seq_lens, case.scale, case.max_query_len, case.max_seq_len)
    label = f"{model} q={q_lens[0]}x{len(q_lens)} ctx={seq_lens[0]}"
    rows = [Row("prefill_attention", label, "ref", time_ms(lambda: pfa.paged_prefill_attention_ref(*args), device, reps), gbytes)]
    if with_triton:
        rows.append(Row("prefill_attention", label, "triton",
                        time_ms(lambda: pfa.paged_prefill_attention(*args), device, reps), gbytes))
    return rows


def mixed_rows(device, dtype, model, decodes, ctx, prompts, prompt_len, backend, reps) -> list[Row]:
    """A mixed step's attention (``decodes`` one-token sequences at ``ctx``, then ``prompts`` whole prompts)
    through the attention layer: every row by the prefill kernel (num_decodes 0, the peer) and split
    (the decodes by the decode kernel, as the model runner arranges it)."""
    from inference.engine.attention import PagedAttention
    from kernels.dispatch import _ops

    hq, hkv, dim = SHAPES[model]
    q_lens, seq_lens = [1] * decodes + [prompt_len] * prompts, [ctx] * decodes + [prompt_len] * prompts
    case = make_paged_case(q_lens, seq_lens, hq, hkv, dim, 16, dtype, device)
    esize = torch.empty((), dtype=dtype).element_size()
    gbytes = (2 * sum(seq_lens) * hkv * dim + 2 * sum(q_lens) * hq * dim) * esize / 1e9
    ops, layer = _ops(backend), PagedAttention(hq, hkv, dim, case.scale)
    label = f"{model} {decodes}x1@{ctx}+{prompts}x{prompt_len}"
    rows = []
    for impl, n in ((f"{backend} prefill kernel, all rows", 0), (f"{backend} decodes split off", decodes)):
        m = case.attention_metadata(n)
        rows.append(Row("mixed_step_attention", label, impl,
                        time_ms(lambda: layer(case.q, (case.k_cache, case.v_cache), m, ops), device, reps),
                        gbytes))
    return rows


def elementwise_rows(device, dtype, tokens, hidden, inter, with_triton, reps) -> list[Row]:
    esize = torch.empty((), dtype=dtype).element_size()
    x = torch.randn(tokens, hidden, device=device).to(dtype)
    r = torch.randn_like(x)
    w = torch.ones(hidden, device=device, dtype=dtype)
    gate_up = torch.randn(tokens, 2 * inter, device=device).to(dtype)
    hq, hkv, dim = SHAPES["llama-3.2-1b"] if hidden >= 2048 else SHAPES["smollm2-135m"]
    q = torch.randn(tokens, hq, dim, device=device).to(dtype)
    k = torch.randn(tokens, hkv, dim, device=device).to(dtype)
    positions = torch.randint(0, 4096, (tokens,), device=device)
    cache = rotary.build_cos_sin_cache(dim, 4096, 500000.0, device)
    blocks = -(-tokens // 16) + 8
    k_cache = torch.zeros(blocks, 16, hkv, dim, device=device, dtype=dtype)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.randperm(blocks * 16, device=device)[:tokens]
    v = torch.randn_like(k)
    label = f"T={tokens} H={hidden}"
    cases = [
        ("rms_norm", (rms.rms_norm_ref, rms.rms_norm), (x, w, 1e-5), 2 * x.numel() * esize),
        ("fused_add_rms_norm", (rms.fused_add_rms_norm_ref, rms.fused_add_rms_norm), (x, r, w, 1e-5),
         4 * x.numel() * esize),
        ("silu_and_mul", (activation.silu_and_mul_ref, activation.silu_and_mul), (gate_up,),
         1.5 * gate_up.numel() * esize),
        ("rotary_embedding", (rotary.rotary_embedding_ref, rotary.rotary_embedding), (positions, q, k, cache),
         2 * (q.numel() + k.numel()) * esize),
        ("store_kv", (kv_store.store_kv_ref, kv_store.store_kv), (k, v, k_cache, v_cache, slots),
         4 * k.numel() * esize),
        # q read and written, k and v read and written to the cache
        ("rotary_and_store_kv", (rkv.rotary_and_store_kv_ref, rkv.rotary_and_store_kv),
         (positions, q, k, v, cache, k_cache, v_cache, slots), 2 * (q.numel() + 2 * k.numel()) * esize),
    ]
    rows = []
    for op, (ref, tri), args, nbytes in cases:
        rows.append(Row(op, label, "ref", time_ms(lambda: ref(*args), device, reps), nbytes / 1e9))
        if with_triton:
            rows.append(Row(op, label, "triton", time_ms(lambda: tri(*args), device, reps, graph=True),
                            nbytes / 1e9))
    if with_triton:  # the fused op's peer: the two Triton kernels it replaces, one after the other
        unfused = rkv.rotary_then_store(rotary.rotary_embedding, kv_store.store_kv)
        args = cases[-1][2]
        rows.append(Row("rotary_and_store_kv", label, "triton, the 2 unfused",
                        time_ms(lambda: unfused(*args), device, reps, graph=True), cases[-1][3] / 1e9))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--reps", type=int, default=40, help="CPU timing repetitions")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--cpu-time", action="store_true",
                        help="CPU: time with process CPU time, robust on a shared machine (pair with --threads 1)")
    parser.add_argument("--decode-only", action="store_true", help="only the decode attention rows")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    runtime_configure_from_env()
    global CLOCK
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.cpu_time:
        CLOCK = time.process_time
    load_start = os.getloadavg()[0]
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            sys.exit("--device cuda requested but torch.cuda.is_available() is False")
        if os.environ.get("TRITON_INTERPRET") == "1":
            sys.exit("unset TRITON_INTERPRET to benchmark compiled kernels")
        with_triton, with_native = True, False
        name = torch.cuda.get_device_name(device)
        models, batches, ctx = ("smollm2-135m", "llama-3.2-1b"), (1, 16, 64, 256), 1024
    else:
        tune_cpu_allocator()
        with_triton = False
        name = (f"{cpu_model()} x{torch.get_num_threads()} threads (CPU"
                f"{', process CPU time' if args.cpu_time else ''})")
        models, batches, ctx = ("smollm2-135m",), (1, 64), 512
        with_native = cpu_native.available()
        print("CPU: Triton is not timed here (its interpreter is for tests); benchmarking the CPU "
              "production path: the PyTorch references" + (" and the native decode attention." if with_native
                                                           else " (the native library is unavailable)."))
    reps = args.reps
    bandwidth = copy_bandwidth(device, reps)
    rows: list[Row] = []
    if device.type == "cpu" and with_native:
        for native_ctx in (128, 512, 1024):
            for batch in (1, 16, 64):
                rows += attention_rows(device, dtype, "smollm2-135m", batch, native_ctx, False, False, reps,
                                       with_native=True, with_dense=False)
    for model in () if args.decode_only and rows else models:
        for batch in batches:
            rows += attention_rows(device, dtype, model, batch, ctx, False, with_triton, reps)
        rows += attention_rows(device, dtype, model, 64, 640 if device.type == "cpu" else 2048, True,
                               with_triton, reps, with_native=device.type == "cpu" and with_native)
        if args.decode_only:
            continue
        prompt = 512
        rows += prefill_rows(device, dtype, model, [prompt] * (1 if device.type == "cpu" else 8),
                             [prompt] * (1 if device.type == "cpu" else 8), with_triton, reps)
        rows += prefill_rows(device, dtype, model, [128, 1, 1, 1], [640, 300, 200, 100], with_triton, reps)
        if device.type == "cuda":
            rows += mixed_rows(device, dtype, model, 256, 1024, 2, 512, "triton", reps)
            rows += mixed_rows(device, dtype, model, 64, 1024, 1, 512, "triton", reps)
        else:
            rows += mixed_rows(device, dtype, model, 32, 300, 1, 150, "cpu" if with_native else "ref", reps)
    hidden, inter, tokens = (576, 1536, 1024) if device.type == "cpu" else (2048, 8192, 8192)
    if not args.decode_only:
        rows += elementwise_rows(device, dtype, tokens, hidden, inter, with_triton, reps)
        if device.type == "cuda":  # decode steps' sizes, SmolLM2 shape: where launches, not bytes, count
            for tokens in (1, 256):
                rows += elementwise_rows(device, dtype, tokens, 576, 1536, with_triton, reps)

    print(f"device: {name}; dtype {args.dtype}; measured copy bandwidth {bandwidth:.1f} GB/s (best of {reps})")
    print(f"load average at the start / end: {load_start:.2f} / {os.getloadavg()[0]:.2f} (other processes skew CPU medians; "
          "'best' is the fastest call)")
    print(f"{'op':20s} {'case':34s} {'impl':24s} {'median ms':>10s} {'best ms':>9s} {'GB/s':>7s} {'% copy':>7s}")
    for row in rows:
        print(f"{row.op:20s} {row.case:34s} {row.impl:24s} {row.ms:10.4f} {row.best_ms:9.4f} {row.gb_s:7.1f} "
              f"{100 * row.gb_s / bandwidth:6.1f}%")
    if args.json:
        print(json.dumps({
            "device": name, "dtype": args.dtype, "copy_gb_s": bandwidth,
            "load_avg_start": load_start, "load_avg_end": os.getloadavg()[0],
            "rows": [{"op": r.op, "case": r.case, "impl": r.impl, "ms": r.ms, "best_ms": r.best_ms, "gb_s": r.gb_s}
                     for r in rows],
        }))


if __name__ == "__main__":
    main()
