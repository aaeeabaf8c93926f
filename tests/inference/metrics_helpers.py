"""Reading a /metrics page in tests: parsed with prometheus_client's own text parser."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
GRAFANA_DASHBOARD = ROOT / "deploy" / "grafana" / "llm-platform.json"
METRIC_NAME = re.compile(r"llmp:[A-Za-z0-9_:]+")


class Scrape:
    """One scrape: every sample by name, with its labels."""

    def __init__(self, text: str) -> None:
        self.families = list(text_string_to_metric_families(text))
        self.samples = [sample for family in self.families for sample in family.samples]

    @classmethod
    def get(cls, url: str, **headers: str) -> Scrape:
        response = httpx.get(f"{url}/metrics", headers=headers, timeout=30)
        assert response.status_code == 200, response.text[:500]
        assert response.headers["content-type"].startswith("text/plain")
        return cls(response.text)

    @property
    def names(self) -> set[str]:
        return {sample.name for sample in self.samples}

    def total(self, name: str, **labels: str) -> float:
        """The sum of the samples of `name` whose labels include `labels`."""
        return sum(sample.value for sample in self.samples
                   if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()))

    def series(self, name: str) -> list[dict[str, str]]:
        return [sample.labels for sample in self.samples if sample.name == name]


def grafana_metric_names() -> set[str]:
    """Every llmp: name the Grafana dashboard's queries (panels and template variables) read."""
    import json

    dashboard = json.loads(GRAFANA_DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    exprs += [str(variable.get("query", "")) for variable in dashboard["templating"]["list"]]
    return {name for expr in exprs for name in METRIC_NAME.findall(expr)}
