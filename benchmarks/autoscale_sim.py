"""Offline replay of a day of load against the KEDA autoscaling of deploy/k8s (no cluster, no model).

    python benchmarks/autoscale_sim.py [--overlay cpu] [--seed 1] [--json]

The ScaledObject of `--model` is read from the rendered overlay (benchmarks/autoscale_keda.py: thresholds,
activation, min/max replicas, cooldown, polling interval, HPA behavior). The load: per tier (enterprise, pro,
free) Poisson arrivals whose rate follows a daytime sine (06:00-20:00, peak at 13:00, `--night-rate` at night)
plus `--bursts` bursts of `--burst-rate` req/s for `--burst-s` at seeded times of the day. The service: each
worker has `--slots` concurrent slots and a lognormal service time (`--service-median-s`, `--service-sigma`);
it takes jobs by tier weight (enterprise 6, pro 3, free 1), oldest first; a new replica serves after
`--startup-s` (scheduling and model load). A request for a model with no serving replica waits up to
MODEL_WAIT_S (`--model-wait-s`, config.env's 120) for one, then is refused (503).

Three runs on the same arrivals: `keda` (the manifests' demand query: queued + waiting + held by workers),
`keda_queue_only` (demand = queued + waiting, without what the workers hold) and `static` (a fleet sized for
the peak: ceil(peak rate x mean service time / slots), always up). Each reports per tier the queue wait p50/p95
against its SLO (`--slo-s`), the refused requests, worker-hours, the largest replica count, the scale changes
and the hours at zero. Deterministic for a `--seed`; `--json` makes the last line JSON.
"""

from __future__ import annotations

import argparse
import heapq
import importlib.util
import json
import math
import random
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path


def _load_keda():
    """benchmarks/autoscale_keda.py, loaded by path: benchmarks/ on sys.path would shadow packages (kernels)."""
    if "autoscale_keda" not in sys.modules:
        path = Path(__file__).resolve().parent / "autoscale_keda.py"
        spec = importlib.util.spec_from_file_location("autoscale_keda", path)
        sys.modules["autoscale_keda"] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # registered first: its dataclasses look their module up
    return sys.modules["autoscale_keda"]


_keda = _load_keda()
Autoscaler, ScalingPolicy, scaling_policy = _keda.Autoscaler, _keda.ScalingPolicy, _keda.scaling_policy

TIERS = ("enterprise", "pro", "free")
TIER_WEIGHTS = {"enterprise": 6, "pro": 3, "free": 1}
DT = 0.5  # seconds per simulation tick


@dataclass(frozen=True)
class Load:
    peak: dict  # tier -> req/s at the daytime peak
    night_rate: float = 0.0  # req/s over all tiers outside the daytime
    bursts: tuple = ()  # (start_s, duration_s, extra req/s over all tiers)
    day_s: float = 86400.0

    def rate(self, tier: str, t: float) -> float:
        total = sum(self.peak.values())
        share = self.peak[tier] / total if total else 1 / len(self.peak)
        hour = 24.0 * (t % self.day_s) / self.day_s
        daytime = math.sin(math.pi * (hour - 6.0) / 14.0) ** 1.5 if 6.0 <= hour <= 20.0 else 0.0
        extra = sum(rate for start, length, rate in self.bursts if start <= t < start + length)
        return self.peak[tier] * daytime + share * (self.night_rate + extra)


@dataclass(frozen=True)
class Service:
    slots: int = 16
    median_s: float = 6.0
    sigma: float = 0.8
    startup_s: float = 90.0
    model_wait_s: float = 120.0
    prefill_s: float = 0.3

    @property
    def mean_s(self) -> float:
        return self.median_s * math.exp(self.sigma ** 2 / 2)


@dataclass
class Pod:
    ready_at: float
    draining: bool = False
    ends: list = field(default_factory=list)  # heap of the end times of the requests it holds


class Run:
    """One day: arrivals, queues, pods, and (unless static) the autoscaler every pollingInterval."""

    def __init__(self, *, load: Load, service: Service, seed: int, variant: str, policy: ScalingPolicy | None,
                 static_replicas: int = 0) -> None:
        self.load, self.service, self.variant = load, service, variant
        self.arrivals = random.Random(seed)  # the same seed: the same arrivals in every variant
        self.rng = random.Random(seed + 7919)  # tier picks and service times
        self.scaler = Autoscaler(policy) if policy and variant != "static" else None
        self.pods = [Pod(ready_at=0.0) for _ in range(static_replicas)]
        self.queues = {tier: deque() for tier in TIERS}
        self.waiting: deque = deque()  # (arrival, tier): no serving replica yet
        self.waits = {tier: [] for tier in TIERS}
        self.refused = dict.fromkeys(TIERS, 0)
        self.ttfts: deque = deque()  # (time, ttft) of the last two minutes
        self.worker_s = 0.0
        self.zero_s = 0.0
        self.changes = 0
        self.max_replicas = static_replicas
        self.timeline: list[tuple[float, int]] = []  # (time, replicas) after each poll that changed them

    def serving(self, now: float) -> list[Pod]:
        return [pod for pod in self.pods if pod.ready_at <= now and not pod.draining]

    def arrive(self, now: float) -> None:
        for tier in TIERS:
            for _ in range(self._poisson(self.load.rate(tier, now) * DT)):
                (self.queues[tier].append(now) if self.serving(now) else self.waiting.append((now, tier)))

    def _poisson(self, mean: float) -> int:
        count, threshold, product = 0, math.exp(-mean), self.arrivals.random()
        while product > threshold:
            count += 1
            product *= self.arrivals.random()
        return count

    def release_waiting(self, now: float) -> None:
        while self.waiting and (self.serving(now) or now - self.waiting[0][0] > self.service.model_wait_s):
            arrival, tier = self.waiting.popleft()
            if self.serving(now):
                self.queues[tier].append(arrival)
            else:
                self.refused[tier] += 1

    def dispatch(self, now: float) -> None:
        for pod in self.pods:
            while pod.ends and pod.ends[0] <= now:
                heapq.heappop(pod.ends)
        self.pods = [pod for pod in self.pods if not (pod.draining and not pod.ends)]
        open_pods = [pod for pod in self.serving(now) if len(pod.ends) < self.service.slots]
        while open_pods and any(self.queues.values()):
            tiers = [tier for tier in TIERS if self.queues[tier]]
            tier = self.rng.choices(tiers, weights=[TIER_WEIGHTS[t] for t in tiers])[0]
            wait = now - self.queues[tier].popleft()
            self.waits[tier].append(wait)
            self.ttfts.append((now, wait + self.service.prefill_s))
            pod = min(open_pods, key=lambda p: len(p.ends))
            duration = self.rng.lognormvariate(math.log(self.service.median_s), self.service.sigma)
            heapq.heappush(pod.ends, now + duration)
            open_pods = [p for p in open_pods if len(p.ends) < self.service.slots]

    def metrics(self, now: float) -> tuple[float, float]:
        while self.ttfts and now - self.ttfts[0][0] > 120.0:
            self.ttfts.popleft()
        queued = sum(map(len, self.queues.values())) + len(self.waiting)
        held = sum(len(pod.ends) for pod in self.pods)
        ttft = percentile([value for _, value in self.ttfts], 95) if self.ttfts else 0.0
        return (queued + held if self.variant == "keda" else queued), ttft

    def scale(self, now: float) -> None:
        demand, ttft = self.metrics(now)
        live = [pod for pod in self.pods if not pod.draining]
        target = self.scaler.poll(now, demand=demand, ttft=ttft)
        if target != len(live):
            self.changes += 1
            self.timeline.append((now, target))
        for _ in range(target - len(live)):
            self.pods.append(Pod(ready_at=now + self.service.startup_s))
        for pod in sorted(live, key=lambda p: (p.ready_at <= now, len(p.ends)))[:max(0, len(live) - target)]:
            pod.draining = True  # not yet loaded: gone at once (no requests); serving: drains its requests
        self.max_replicas = max(self.max_replicas, target)

    def run(self) -> dict:
        polling = self.scaler.policy.polling_s if self.scaler else math.inf
        next_poll, now = (0.0 if self.scaler else math.inf), 0.0
        while now < self.load.day_s:
            self.arrive(now)
            self.release_waiting(now)
            self.dispatch(now)
            if now >= next_poll:
                self.scale(now)
                next_poll += polling
            self.worker_s += DT * len(self.pods)
            self.zero_s += DT * (not self.pods)
            now += DT
        return self.report()

    def report(self) -> dict:
        tiers = {tier: {"requests": len(waits) + self.refused[tier], "refused": self.refused[tier],
                        "wait_p50_s": round(percentile(waits, 50), 2), "wait_p95_s": round(percentile(waits, 95), 2),
                        "wait_p99_s": round(percentile(waits, 99), 2), "wait_max_s": round(max(waits, default=0), 1)}
                 for tier, waits in self.waits.items()}
        return {"tiers": tiers, "worker_hours": round(self.worker_s / 3600, 2), "max_replicas": self.max_replicas,
                "scale_changes": self.changes, "hours_at_zero": round(self.zero_s / 3600, 2)}


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def static_size(load: Load, service: Service) -> int:
    peak = max(sum(load.rate(tier, t) for tier in TIERS) for t in range(0, int(load.day_s), 30))
    return max(1, math.ceil(peak * service.mean_s / service.slots))


def simulate(*, policy: ScalingPolicy, load: Load, service: Service, seed: int, slo_s: dict) -> dict:
    static = static_size(load, service)
    runs = {"keda": Run(load=load, service=service, seed=seed, variant="keda", policy=policy).run(),
            "keda_queue_only": Run(load=load, service=service, seed=seed, variant="queue", policy=policy).run(),
            "static": Run(load=load, service=service, seed=seed, variant="static", policy=None,
                          static_replicas=static).run()}
    for result in runs.values():
        for tier, figures in result["tiers"].items():
            figures["slo_s"], figures["slo_met"] = slo_s[tier], figures["wait_p95_s"] <= slo_s[tier]
    runs["static"]["replicas"] = static
    return runs


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--overlay", default="cpu")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--peak", default="enterprise=1.2,pro=1.0,free=0.8", help="tier=req/s at the daily peak")
    parser.add_argument("--night-rate", type=float, default=0.0, help="req/s, all tiers, 20:00-06:00")
    parser.add_argument("--bursts", type=int, default=6)
    parser.add_argument("--burst-rate", type=float, default=2.0)
    parser.add_argument("--burst-s", type=float, default=300.0)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--service-median-s", type=float, default=6.0)
    parser.add_argument("--service-sigma", type=float, default=0.8)
    parser.add_argument("--startup-s", type=float, default=90.0)
    parser.add_argument("--model-wait-s", type=float, default=120.0)
    parser.add_argument("--slo-s", default="enterprise=5,pro=10,free=30", help="tier=queue-wait p95 SLO")
    parser.add_argument("--json", action="store_true")
    return parser.parse_args(argv)


def _pairs(text: str) -> dict:
    return {key: float(value) for key, value in (item.split("=") for item in text.split(","))}


def main(argv=None) -> dict:
    args = parse_args(argv)
    rng = random.Random(args.seed + 1)
    bursts = tuple((rng.uniform(0, 86400 - args.burst_s), args.burst_s, args.burst_rate) for _ in range(args.bursts))
    load = Load(peak=_pairs(args.peak), night_rate=args.night_rate, bursts=bursts)
    service = Service(slots=args.slots, median_s=args.service_median_s, sigma=args.service_sigma,
                      startup_s=args.startup_s, model_wait_s=args.model_wait_s)
    policy = scaling_policy(args.overlay, args.model)
    runs = simulate(policy=policy, load=load, service=service, seed=args.seed, slo_s=_pairs(args.slo_s))
    print(f"{policy.name} ({args.overlay}): demand target {policy.demand_target:g}/replica, activation "
          f"{policy.demand_activation:g}, TTFT p95 target {policy.ttft_target:g} s, replicas "
          f"{policy.min_replicas}-{policy.max_replicas}, cooldown {policy.cooldown_s:g} s, "
          f"polling {policy.polling_s:g} s")
    for name, result in runs.items():
        tiers = ", ".join(f"{tier} p95 {f['wait_p95_s']:g} s/{f['slo_s']:g} {'ok' if f['slo_met'] else 'MISSED'}"
                          f" (p99 {f['wait_p99_s']:g}, max {f['wait_max_s']:g}; "
                          f"{f['refused']} refused of {f['requests']})" for tier, f in result["tiers"].items())
        print(f"{name:16s} worker-hours {result['worker_hours']:6.2f}  max {result['max_replicas']}  "
              f"at zero {result['hours_at_zero']:5.2f} h  changes {result['scale_changes']:3d}  {tiers}")
    saved = 1 - runs["keda"]["worker_hours"] / runs["static"]["worker_hours"]
    print(f"keda uses {saved:.0%} fewer worker-hours than the static fleet of {runs['static']['replicas']}")
    summary = {"policy": vars(policy), "bursts": [list(b) for b in bursts], "seed": args.seed, **runs}
    if args.json:
        print(json.dumps(summary, sort_keys=True))
    return summary


if __name__ == "__main__":
    main()
