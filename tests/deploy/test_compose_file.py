"""deploy/compose.yaml against deploy/env.example: stopping the stack (a redeploy, `docker compose down`)
drains what is in hand instead of cutting it. A request lives at most ADMISSION_HOLD_S, so the web's graceful
shutdown and every worker's stop grace must be above it, as deploy/k8s's terminationGracePeriodSeconds are."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+)(s|m)", value)
    assert match, value
    return int(match.group(1)) * (60 if match.group(2) == "m" else 1)


def _env_example() -> dict[str, str]:
    lines = (DEPLOY / "env.example").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#") and "=" in line)


def test_web_and_workers_drain_requests_as_long_as_one_may_live():
    services = yaml.safe_load((DEPLOY / "compose.yaml").read_text())["services"]
    hold = float(_env_example()["ADMISSION_HOLD_S"])
    web = services["web"]
    command = web["command"]
    graceful = float(command[command.index("--timeout-graceful-shutdown") + 1])
    assert graceful >= hold
    assert _seconds(web["stop_grace_period"]) > graceful  # docker's SIGKILL comes after uvicorn's drain
    workers = [name for name, service in services.items() if "run_worker" in " ".join(service.get("command", []))]
    assert workers
    for name in workers:
        assert _seconds(services[name]["stop_grace_period"]) > hold, name
