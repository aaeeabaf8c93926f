"""A/B of the engine's batch-invariant mode: benchmarks/engine_offline.py off and on, interleaved.

    python benchmarks/batch_invariant_ab.py --pairs 3 --out benchmarks/results/<machine-date-name> --json \\
        -- --requests 64 --concurrency 64 --prompt-min 64 --prompt-max 128 --output-len 32 \\
           --prefill-requests 2 --single-prompt-len 64 --peers none

Each pair runs engine_offline.py twice back to back in fresh processes, once plain and once with
--batch-invariant (the order alternates from pair to pair, so a drift of the machine's load does not
favour one side), and takes the ratio on/off of each figure within the pair. On a shared machine the
absolute figures move with the other jobs; the ratios of back-to-back runs move less. The summary is
the median of each side and the median of the per-pair ratios. Each run's JSON goes to --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ("decode_tok_s", "single_stream_tok_s", "output_tok_s", "prefill_tok_s")


def run_once(extra: list[str], invariant: bool, out: Path | None, tag: str) -> dict:
    command = [sys.executable, str(ROOT / "benchmarks" / "engine_offline.py"), *extra, "--json"]
    command += ["--batch-invariant", "on" if invariant else "off"]
    started = time.time()
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True)
    data = json.loads(result.stdout.strip().splitlines()[-1])
    data["started_at"] = started
    if out is not None:
        (out / f"{tag}.json").write_text(json.dumps(data, indent=1))
        (out / f"{tag}.log").write_text(result.stderr)
    return data["engine"]


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    extra: list[str] = []
    if "--" in argv:
        extra = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--out", type=Path, help="folder for each run's JSON and log")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    pairs = []
    for i in range(args.pairs):
        order = (False, True) if i % 2 == 0 else (True, False)
        runs = {}
        for invariant in order:
            tag = f"pair{i + 1}-{'on' if invariant else 'off'}"
            runs[invariant] = run_once(extra, invariant, args.out, tag)
            print(f"{tag}: " + ", ".join(f"{k} {runs[invariant][k]:.1f}" for k in FIGURES
                                         if runs[invariant].get(k) is not None), file=sys.stderr, flush=True)
        pairs.append({"off": runs[False], "on": runs[True],
                      "ratio": {k: runs[True][k] / runs[False][k] for k in FIGURES
                                if runs[True].get(k) and runs[False].get(k)}})
    summary = {
        figure: {"off_median": statistics.median(p["off"][figure] for p in pairs),
                 "on_median": statistics.median(p["on"][figure] for p in pairs),
                 "ratios": [round(p["ratio"][figure], 3) for p in pairs],
                 "ratio_median": statistics.median(p["ratio"][figure] for p in pairs)}
        for figure in FIGURES if all(figure in p["ratio"] for p in pairs)
    }
    for figure, row in summary.items():
        print(f"{figure}: off {row['off_median']:.1f}, on {row['on_median']:.1f}, on/off per pair {row['ratios']}, "
              f"median {row['ratio_median']:.3f}", file=sys.stderr)
    result = {"summary": summary, "args": extra, "pairs": args.pairs}
    if args.out is not None:
        (args.out / "summary.json").write_text(json.dumps(result, indent=1))
    if args.json:
        print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
