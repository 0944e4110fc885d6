"""The chart's Grafana dashboards run against a real Prometheus the way Grafana runs them: each query
variable (`label_values(<series selector>, <label>)`) resolved in order through the label values API with
the earlier variables filled in, as Grafana's Prometheus data source does; then every panel's queries
with the chosen values (a multi-value variable on "All" is its `allValue`, `.*`).

    api = PrometheusApi(get)                      # get(path, params) -> the answer's "data"
    chosen = resolve_variables(dashboard, api, {"consumer": "homes"}, rate_interval="1m")
    for title, expression in panel_queries(dashboard, chosen): ...

Only the standard library; shared by the integration tier (a Prometheus on 127.0.0.1) and the node tier
(the Prometheus Operator's Prometheus, through the API server's pod proxy).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO_ROOT / "charts" / "hubshift" / "dashboards"
LABEL_VALUES = re.compile(r"^label_values\((?P<selector>.*),\s*(?P<label>[a-zA-Z_][a-zA-Z0-9_]*)\)$")
# Metrics only the Spark engine exports (the JVM's and Spark's own figures).
SPARK_ONLY = re.compile(r"\bhubshift_consumer_(jvm|spark)_")


def dashboards() -> dict[str, dict[str, Any]]:
    """The chart's dashboards by file stem (hubshift-overview, hubshift-consumer)."""
    return {path.stem: json.loads(path.read_text()) for path in sorted(DASHBOARDS.glob("*.json"))}


@dataclass
class PrometheusApi:
    """Prometheus' HTTP API over any transport: `get(path, params)` returns the answer's `data`."""

    get: Callable[[str, Mapping[str, str]], Any]

    def label_values(self, label: str, selector: str) -> list[str]:
        values: list[str] = self.get(f"/api/v1/label/{label}/values", {"match[]": selector})
        return values

    def query(self, expression: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.get("/api/v1/query", {"query": expression})["result"]
        return result

    def query_range(self, expression: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        params = {"query": expression, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        result: list[dict[str, Any]] = self.get("/api/v1/query_range", params)["result"]
        return result


def fill(expression: str, chosen: Mapping[str, str]) -> str:
    """The expression with `$name` replaced by each chosen value (longest names first, as Grafana does)."""
    for name in sorted(chosen, key=len, reverse=True):
        expression = expression.replace(f"${name}", chosen[name])
    return expression


def resolve_variables(
    dashboard: Mapping[str, Any], api: PrometheusApi, pick: Mapping[str, str], *, rate_interval: str
) -> dict[str, str]:
    """Each query variable's value, resolved as Grafana does: `pick` for a single-value variable (it must be
    among the values Prometheus returns), "All" (`allValue`) for a multi-value one, whose values must not be
    empty either. Also `__rate_interval`. AssertionError names the variable that found nothing."""
    chosen: dict[str, str] = {"__rate_interval": rate_interval}
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        name = variable["name"]
        match = LABEL_VALUES.match(variable["query"]["query"])
        assert match, f"{name}: not a label_values() query: {variable['query']['query']}"
        selector = fill(match["selector"], chosen)
        values = api.label_values(match["label"], selector)
        assert values, f"variable {name}: label_values({selector}, {match['label']}) found nothing"
        if variable.get("multi") and variable.get("includeAll") and name not in pick:
            chosen[name] = variable.get("allValue") or "|".join(re.escape(v) for v in values)
        else:
            wanted = pick.get(name, values[0])
            assert wanted in values, f"variable {name}: {wanted!r} is not among {values}"
            chosen[name] = wanted
    return chosen


def panel_queries(dashboard: Mapping[str, Any], chosen: Mapping[str, str]) -> list[tuple[str, str]]:
    """(panel title, PromQL with the variables filled in) of every query of every panel."""
    return [
        (panel["title"], fill(target["expr"], chosen))
        for panel in dashboard["panels"]
        if panel["type"] != "row"
        for target in panel["targets"]
    ]


def has_value(result: list[dict[str, Any]]) -> bool:
    """Some series of an instant or range answer has a finite value: what Grafana would draw."""
    for series in result:
        points = series.get("values") or ([series["value"]] if "value" in series else [])
        if any(math.isfinite(float(value)) for _, value in points):
            return True
    return False
