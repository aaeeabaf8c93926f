"""benchmarks/autoscale_sim.py on the cpu overlay's ScaledObject: from zero when load comes, back to zero after
the cooldown, fewer worker-hours than a fleet sized for the peak, the same figures for the same seed."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "autoscale_sim.py"
_SPEC = importlib.util.spec_from_file_location("autoscale_sim", _PATH)
sim = importlib.util.module_from_spec(_SPEC)
sys.modules["autoscale_sim"] = sim  # its dataclasses look their module up while it is executed
_SPEC.loader.exec_module(sim)

QUIET = {"enterprise": 0.0, "pro": 0.0, "free": 0.0}


@pytest.fixture(scope="module")
def policy():
    return sim.scaling_policy("cpu")


def test_the_policy_is_the_manifests(policy):
    assert (policy.min_replicas, policy.max_replicas, policy.cooldown_s, policy.polling_s) == (0, 4, 900, 15)
    assert policy.demand_target == 16 and policy.ttft_target == 2 and policy.down_window_s == 600


def test_a_burst_wakes_the_model_and_it_goes_back_to_zero(policy):
    load = sim.Load(peak=QUIET, bursts=((600.0, 300.0, 2.0),), day_s=4000.0)
    run = sim.Run(load=load, service=sim.Service(), seed=3, variant="keda", policy=policy)
    result = run.run()
    (first_time, first), *_ = run.timeline
    assert first == 1 and 600.0 <= first_time <= 600.0 + policy.polling_s  # activation at the next poll
    assert max(n for _, n in run.timeline) >= 2  # the HPA takes over from one
    last_time, last = run.timeline[-1]
    assert last == 0 and last_time >= 900.0 + policy.cooldown_s  # idle for the cooldown, then zero
    assert sum(f["refused"] for f in result["tiers"].values()) == 0  # MODEL_WAIT_S outlasts the cold start
    assert result["hours_at_zero"] > 0.5


def test_fewer_worker_hours_than_a_static_fleet_and_deterministic(policy):
    load = sim.Load(peak={"enterprise": 1.2, "pro": 1.0, "free": 0.8}, bursts=((9000.0, 300.0, 2.0),), day_s=21600.0)
    slo = {"enterprise": 5.0, "pro": 10.0, "free": 30.0}
    runs = sim.simulate(policy=policy, load=load, service=sim.Service(), seed=5, slo_s=slo)
    assert runs["keda"]["worker_hours"] < runs["static"]["worker_hours"]
    assert all(figures["slo_met"] for figures in runs["keda"]["tiers"].values())
    # without what the workers hold, demand drops to zero under a steady load: the fleet flaps
    assert runs["keda_queue_only"]["scale_changes"] > 2 * runs["keda"]["scale_changes"]
    assert runs == sim.simulate(policy=policy, load=load, service=sim.Service(), seed=5, slo_s=slo)


def test_hpa_math_and_behavior(policy):
    scaler = sim.Autoscaler(policy)
    assert scaler.poll(0.0, demand=1, ttft=0.0) == 1  # activation: 0 -> 1
    assert scaler.poll(15.0, demand=100, ttft=0.0) == 3  # ceil(100 / 16) = 7, at most 2 pods a minute
    assert scaler.poll(30.0, demand=100, ttft=0.0) == 3
    assert scaler.poll(75.0, demand=100, ttft=0.0) == 4  # maxReplicaCount
    assert scaler.poll(90.0, demand=0.5, ttft=0.0) == 4  # the scale-down window keeps the recent peak
    assert scaler.poll(90.0 + policy.down_window_s + 1, demand=0.5, ttft=0.0) == 3  # then one pod per period


def test_json_last_line(capsys):
    sim.main(["--seed", "2", "--bursts", "0", "--json", "--peak", "enterprise=0.2,pro=0.2,free=0.2"])
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"keda", "keda_queue_only", "static", "policy"} <= set(summary)
