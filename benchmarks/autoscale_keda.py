"""KEDA's and the HPA's scaling decisions, as benchmarks/autoscale_sim.py replays them offline.

`scaling_policy(overlay)` reads a model's ScaledObject from a rendered overlay of deploy/k8s (kubectl kustomize,
else the base's YAML); `Autoscaler` applies it every pollingInterval:

- at zero: KEDA activates (0 -> 1) once any trigger is active (its metric above its activationThreshold);
- at one or more: the HPA's desired count is the largest over the triggers, AverageValue
  ceil(metric / threshold), Value ceil(replicas * metric / threshold), a ratio within the HPA's 10 %
  tolerance changing nothing; clamped to [1, maxReplicaCount];
- behavior: scale-up at most `up_pods` per `up_period_s`; scale-down to the largest recommendation of the
  last stabilizationWindowSeconds, at most `down_pods` per `down_period_s`;
- to zero: KEDA deactivates (-> 0) when every trigger has been inactive for cooldownPeriod.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
HPA_TOLERANCE = 0.1


@dataclass(frozen=True)
class ScalingPolicy:
    name: str
    polling_s: float
    cooldown_s: float
    min_replicas: int
    max_replicas: int
    demand_target: float
    demand_activation: float
    ttft_target: float
    ttft_activation: float
    down_window_s: float
    down_pods: int
    down_period_s: float
    up_pods: int
    up_period_s: float


def _objects(overlay: str) -> list[dict]:
    kubectl = shutil.which("kubectl")
    if kubectl:
        out = subprocess.run([kubectl, "kustomize", str(K8S / "overlays" / overlay)], capture_output=True,
                             text=True, check=True, timeout=60).stdout
        return [doc for doc in yaml.safe_load_all(out) if doc]
    return [doc for path in sorted((K8S / "base").glob("scaledobject-*.yaml"))
            for doc in yaml.safe_load_all(path.read_text()) if doc]


def scaling_policy(overlay: str = "cpu", model: str = "smollm2-135m-instruct") -> ScalingPolicy:
    (scaled,) = [o for o in _objects(overlay) if o["kind"] == "ScaledObject"
                 and o["spec"]["scaleTargetRef"]["name"] == f"worker-{model}"]
    spec = scaled["spec"]
    triggers = {t["name"]: t["metadata"] for t in spec["triggers"]}
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    (down,), (up,) = behavior["scaleDown"]["policies"], behavior["scaleUp"]["policies"]
    return ScalingPolicy(
        name=scaled["metadata"]["name"], polling_s=spec.get("pollingInterval", 30),
        cooldown_s=spec.get("cooldownPeriod", 300), min_replicas=spec.get("minReplicaCount", 0),
        max_replicas=spec.get("maxReplicaCount", 100),
        demand_target=float(triggers["demand"]["threshold"]),
        demand_activation=float(triggers["demand"].get("activationThreshold", 0)),
        ttft_target=float(triggers["ttft-p95"]["threshold"]),
        ttft_activation=float(triggers["ttft-p95"].get("activationThreshold", 0)),
        down_window_s=behavior["scaleDown"].get("stabilizationWindowSeconds", 300),
        down_pods=down["value"], down_period_s=down["periodSeconds"],
        up_pods=up["value"], up_period_s=up["periodSeconds"])


class Autoscaler:
    """The replica count KEDA and its HPA would set, fed the triggers' metrics every pollingInterval."""

    def __init__(self, policy: ScalingPolicy) -> None:
        self.policy = policy
        self.replicas = policy.min_replicas
        self.last_active = -math.inf
        self.recommendations: deque[tuple[float, int]] = deque()
        self.changes: deque[tuple[float, int]] = deque()  # (time, +n/-n) for the behavior policies

    def _hpa_desired(self, demand: float, ttft: float) -> int:
        p = self.policy
        ratio_ttft = ttft / p.ttft_target
        by_ttft = self.replicas if abs(ratio_ttft - 1) <= HPA_TOLERANCE else math.ceil(self.replicas * ratio_ttft)
        by_demand = math.ceil(demand / p.demand_target)
        if abs(demand / (p.demand_target * self.replicas) - 1) <= HPA_TOLERANCE:
            by_demand = self.replicas
        return max(1, min(p.max_replicas, max(by_demand, by_ttft)))

    def _moved(self, now: float, period: float, sign: int) -> int:
        return sum(abs(n) for t, n in self.changes if now - t < period and n * sign > 0)

    def _behave(self, now: float, desired: int) -> int:
        p = self.policy
        self.recommendations.append((now, desired))
        while self.recommendations and now - self.recommendations[0][0] > p.down_window_s:
            self.recommendations.popleft()
        if desired > self.replicas:
            room = max(0, p.up_pods - self._moved(now, p.up_period_s, +1))
            return self.replicas + min(room, desired - self.replicas)
        stable = max(n for _, n in self.recommendations)  # the largest of the window: no flapping down
        if stable < self.replicas:
            room = max(0, p.down_pods - self._moved(now, p.down_period_s, -1))
            return self.replicas - min(room, self.replicas - stable)
        return self.replicas

    def poll(self, now: float, *, demand: float, ttft: float) -> int:
        """The replica count after this poll, from the demand (requests) and the TTFT p95 (seconds)."""
        p = self.policy
        active = demand > p.demand_activation or ttft > p.ttft_activation
        if active:
            self.last_active = now
        if self.replicas == 0:  # KEDA itself: activation, not an HPA scale event
            target = 1 if active else 0
        elif not active and p.min_replicas == 0 and now - self.last_active >= p.cooldown_s:
            target = 0  # KEDA itself: deactivation
            self.recommendations.clear()
            self.changes.clear()
        else:
            target = self._behave(now, self._hpa_desired(demand, ttft))
            if target != self.replicas:  # the HPA's scale events, which its behavior policies count
                self.changes.append((now, target - self.replicas))
            while self.changes and now - self.changes[0][0] > max(p.up_period_s, p.down_period_s):
                self.changes.popleft()
        self.replicas = target
        return target
