"""The engine's host work per decode step in two checkouts, interleaved: one commit against another.

`engine_host.py` measures one tree with its two detokenizers as each other's peer;
this runs `engine_host.run_steps` (byte-level detokenizer) from each checkout in
turn, a fresh process per run, so a change to the scheduler, the input
preparation or the token bookkeeping is measured against the code before it on
the same machine in the same minutes. Give the peer first:

    git worktree add /tmp/before HEAD~1
    python benchmarks/engine_host_ab.py /tmp/before . --rounds 5 --mode async_output --json

Between two forwards on a GPU sit schedule + prepare + take with `--mode async_output`
(the CUDA default), none of them with `--mode async_scheduling`; the script prints
that sum apart.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine_host  # noqa: E402
from _compare import medians_against  # noqa: E402

PHASES = ("schedule", "prepare", "take", "output", "step")

# runs in the measured checkout, with its own engine_host and gpu_engine (the same model as engine_host.py's)
_RUN = r"""
import argparse, dataclasses, json, sys, tempfile
from pathlib import Path
tree, mode, batch, context, steps, vocab = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7])
sys.path[:0] = [tree, tree + "/benchmarks"]
from engine_host import run_steps
from gpu_engine import SHAPES, write_checkpoint
args = argparse.Namespace(batch=batch, context=context, steps=steps, vocab=vocab, mode=mode)
with tempfile.TemporaryDirectory() as tmp:
    write_checkpoint(dataclasses.replace(SHAPES["tiny"], vocab=vocab), Path(tmp), 0)
    print("PHASES " + json.dumps(run_steps(Path(tmp), args, "byte-level")))
"""


def run_once(tree: Path, args) -> dict[str, float]:
    """One process running `tree`'s engine: median ms per step of each phase."""
    proc = subprocess.run(
        [sys.executable, "-c", _RUN, str(tree), args.mode,
         *map(str, (args.batch, args.context, args.steps, engine_host.VOCAB))],
        capture_output=True, text=True, cwd=tree, check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("PHASES ")]
    if proc.returncode or not lines:
        sys.exit(f"{tree}: the run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("PHASES "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("peer", type=Path, help="checkout measured as the peer (e.g. a worktree of the commit before)")
    parser.add_argument("tree", type=Path, help="checkout measured against it")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--steps", type=int, default=30, help="timed decode steps per run")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each checkout, alternating")
    parser.add_argument("--mode", choices=["async_output", "async_scheduling"], default="async_output")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    trees = {"peer": args.peer.resolve(), "tree": args.tree.resolve()}
    for name, path in trees.items():
        if not (path / "inference" / "engine").is_dir():
            parser.error(f"{name} {path} is not a checkout of this project")
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, path in trees.items():
            runs[name].append(run_once(path, args))
    labels = {name: f"{name} ({path.name})" for name, path in trees.items()}
    report = {"batch": args.batch, "context": args.context, "mode": args.mode, "rounds": args.rounds,
              "checkouts": {name: str(path) for name, path in trees.items()}, "ms_per_step": {}}
    between = {name: [r["schedule"] + r["prepare"] + r["take"] for r in rs] for name, rs in runs.items()}
    for phase, samples in [*((p, {n: [r[p] for r in rs] for n, rs in runs.items()}) for p in PHASES),
                           ("schedule+prepare+take", between)]:
        print(f"-- {phase} ms per step (median of {args.rounds} runs of {args.steps} steps' medians)")
        labelled = {labels[name]: values for name, values in samples.items()}
        report["ms_per_step"][phase] = medians_against(labelled, labels["peer"], unit="ms")[0]
    if args.json:
        print(json.dumps(report))


if __name__ == "__main__":
    main()
