#!/usr/bin/env bash
# The GPU checks and measurements a session with a lent GPU owes, in as few device calls as fit the
# 10-minute limit of one call (the time limits of each call's parts below add up to under 600 s).
# Run from the repository root on the device machine:
#
#   bash benchmarks/gpu_session.sh tests engine        # call 1: CUDA tests, gpu_engine.py with async scheduling
#   bash benchmarks/gpu_session.sh peers kernels       # call 2: the same-call peers, kernel rows
#   bash benchmarks/gpu_session.sh profile             # if the 256 x 512/256 workload's prompt steps dominate
#
# Parts (each writes $OUT/<part>.log, the folder the device tool brings back; one log per part, at most 8):
#   tests    the CUDA tests: every Triton kernel at real shapes, graph replay vs eager, the sampler, the
#            mixed-step split, async scheduling vs the synchronous engine
#   engine   gpu_engine.py --async-scheduling --json (the candidate for the CUDA default: opt-in until this
#            and the tests part pass): greedy check vs transformers, decode steps, 256 x 512/256 vs generate
#   peers    gpu_engine.py on the SmolLM2 shape as the engine defaults (deferred outputs, no async
#            scheduling), then with --async-scheduling --no-split-mixed (each the peer of one change; the
#            engine part's SmolLM2 rows are the other side)
#   kernels  kernels.py --device cuda --json (mixed-step attention rows, and the fused rotary + K/V store
#            against the two kernels it replaces at decode sizes, included)
#   profile  gpu_profile.py: torch.profiler tables of a prefill, a mixed and a decode step
# Each part's log ends with its exit status; a part that fails does not stop the next.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_session}
mkdir -p "$OUT"
export PYTHONPATH=. HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1

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
        part tests 150 python -m pytest -q -p no:cacheprovider \
            tests/kernels/test_triton_kernels.py tests/engine/test_cuda_graphs.py tests/engine/test_sampling.py \
            tests/engine/test_attention_split.py \
            "tests/engine/test_engine_async_scheduling.py::test_async_scheduling_on_cuda_matches_the_synchronous_engine" ;;
    engine)
        part engine 420 python benchmarks/gpu_engine.py --async-scheduling --json ;;
    peers)
        part peers 400 bash -c 'python benchmarks/gpu_engine.py --shapes smollm2-135m --skip-check --json &&
            python benchmarks/gpu_engine.py --shapes smollm2-135m --skip-check --async-scheduling --no-split-mixed --json' ;;
    kernels)
        part kernels 180 python benchmarks/kernels.py --device cuda --json ;;
    profile)
        part profile 300 python benchmarks/gpu_profile.py ;;
    *)
        echo "unknown part: $what (tests, engine, peers, kernels, profile)" >&2
        exit 2 ;;
    esac
done
