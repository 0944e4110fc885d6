"""Writes the Grafana dashboards in charts/hubshift/dashboards/ (plain JSON files, and the chart's
ConfigMaps): the fleet overview and the per-consumer drill-down. The panels are declared once here, so
every panel gets the same datasource variable, ids, grid and legend; `--check` fails when a file differs
from what this script writes (the unit tier runs it). README.md's "Dashboards" describes each panel.

    .venv/bin/python tools/dashboards.py [--check]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "charts" / "hubshift" / "dashboards"
SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
OP = 'namespace=~"$namespace", consumer=~"$consumer"'  # the selector every query carries
WIDTH = 24


@dataclass
class Panel:
    title: str
    description: str
    queries: list[tuple[str, str]]  # (PromQL, legend)
    unit: str = "short"
    kind: str = "timeseries"
    width: int = 12
    height: int = 8
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Row:
    title: str


def variable(name: str, query: str, *, multi: bool) -> dict[str, Any]:
    current = {"selected": True, "text": ["All"], "value": ["$__all"]} if multi else {}
    return {
        "name": name,
        "label": name,
        "type": "query",
        "datasource": DATASOURCE,
        "refresh": 2,
        "includeAll": multi,
        "multi": multi,
        **({"allValue": ".*"} if multi else {}),
        "current": current,
        "query": {"query": query, "refId": name},
        "definition": query,
        "sort": 1,
    }


def dashboard(
    uid: str, title: str, description: str, items: list[Panel | Row], *, multi: bool
) -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    x = y = row_height = 0
    for number, item in enumerate(items, start=1):
        if isinstance(item, Row):
            y += row_height
            x = row_height = 0
            panels.append(
                {"id": number, "type": "row", "title": item.title, "collapsed": False, "panels": [],
                 "gridPos": {"x": 0, "y": y, "w": WIDTH, "h": 1}}
            )  # fmt: skip
            y += 1
            continue
        if x + item.width > WIDTH:
            y += row_height
            x = row_height = 0
        panel: dict[str, Any] = {
            "id": number,
            "type": item.kind,
            "title": item.title,
            "description": item.description,
            "datasource": DATASOURCE,
            "gridPos": {"x": x, "y": y, "w": item.width, "h": item.height},
            "fieldConfig": {"defaults": {"unit": item.unit}, "overrides": []},
            "options": item.options or {"legend": {"displayMode": "list", "placement": "bottom"}},
            "targets": [
                {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": expr, "legendFormat": legend}
                for i, (expr, legend) in enumerate(item.queries)
            ],
        }
        panels.append(panel)
        x += item.width
        row_height = max(row_height, item.height)
    return {
        "title": title,
        "uid": uid,
        "tags": ["hubshift", "eventhubs"],
        "description": description,
        "editable": True,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "timezone": "browser",
        "graphTooltip": 1,
        "annotations": {"list": []},
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "label": "Data source",
                    "type": "datasource",
                    "query": "prometheus",
                    "refresh": 1,
                    "current": {},
                    "hide": 0,
                },
                variable("namespace", "label_values(hubshift_desired_replicas, namespace)", multi=True),
                variable(
                    "consumer",
                    'label_values(hubshift_desired_replicas{namespace=~"$namespace"}, consumer)',
                    multi=multi,
                ),
            ]
        },
        "panels": panels,
    }


def rate(metric: str, by: str, selector: str = OP) -> str:
    return f"sum by ({by}) (rate({metric}{{{selector}}}[$__rate_interval]))"


def increase(metric: str, by: str, selector: str = OP) -> str:
    return f"sum by ({by}) (increase({metric}{{{selector}}}[$__rate_interval]))"


def quantile(q: float, metric: str, by: str) -> str:
    return f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{{{OP}}}[$__rate_interval])))"


STATE = {"showValue": "never", "mergeValues": True, "rowHeight": 0.9, "legend": {"showLegend": False}}


def overview() -> dict[str, Any]:
    by = "namespace, consumer"
    items: list[Panel | Row] = [
        Row("Lag"),
        Panel("Lag in seconds (worst partition)",
              "Age of the oldest unprocessed event in each PartitionedConsumer's worst partition; 0 when "
              "caught up.",
              [(f"max by ({by}) (hubshift_lag_seconds{{{OP}}})", "{{namespace}}/{{consumer}}")], unit="s"),
        Panel("Lag in events",
              "Unprocessed events over all partitions (last enqueued minus checkpoint).",
              [(f"sum by ({by}) (hubshift_backlog_events{{{OP}}})", "{{namespace}}/{{consumer}}")]),
        Row("Pool"),
        Panel("Replicas: desired, current, ready",
              "What the autoscaler wants, what the runtime was asked for, and the consumers passing "
              "readiness.",
              [(f"sum by ({by}) (hubshift_desired_replicas{{{OP}}})", "{{consumer}} desired"),
               (f"sum by ({by}) (hubshift_current_replicas{{{OP}}})", "{{consumer}} current"),
               (f"sum by ({by}) (hubshift_ready_replicas{{{OP}}})", "{{consumer}} ready")]),
        Panel("Phase", "Ready, Holddown or Rebalancing over time.",
              [(f"max by ({by}, phase) (hubshift_phase{{{OP}}}) == 1", "{{consumer}} {{phase}}")],
              kind="state-timeline", options=STATE),
        Row("Rebalancing"),
        Panel("Rebalances by reason",
              "Assignments published: partitions changed, holddown over, orphans, drain.",
              [(increase("hubshift_rebalances_total", f"{by}, reason"), "{{consumer}} {{reason}}")]),
        Panel("Partition moves", "Partitions handed from one consumer to another.",
              [(increase("hubshift_partition_moves_total", by), "{{consumer}}")]),
        Panel("Partitions without an owner", "Partitions no live consumer holds (nobody reads them).",
              [(f"max by ({by}) (hubshift_unowned_partitions{{{OP}}})", "{{consumer}}")]),
        Panel("Scale events", "Replica count changes, up or down.",
              [(increase("hubshift_scale_events_total", f"{by}, direction"), "{{consumer}} {{direction}}")]),
        Row("Operator"),
        Panel("Control-loop cycle time (p95)", "One cycle of the control loop: observe, decide, act, report.",
              [(quantile(0.95, "hubshift_cycle_duration_seconds", by), "{{consumer}}")], unit="s"),
        Panel("Control-loop errors", "Cycles that raised (the next one retries with a back-off).",
              [(increase("hubshift_cycle_errors_total", by), "{{consumer}}")]),
    ]  # fmt: skip
    return dashboard(
        "hubshift-overview",
        "hubshift: fleet overview",
        "Every PartitionedConsumer: lag in seconds and in events, replicas against desired, phase, "
        "rebalances.",
        items,
        multi=True,
    )


def drilldown() -> dict[str, Any]:
    pods = "pod"
    items: list[Panel | Row] = [
        Row("Partitions"),
        Panel("Lag in seconds per partition", "Age of each partition's oldest unprocessed event.",
              [(f"max by (partition) (hubshift_partition_lag_seconds{{{OP}}})", "{{partition}}")], unit="s"),
        Panel("Lag in events per partition", "Unprocessed events of each partition.",
              [(f"max by (partition) (hubshift_partition_backlog_events{{{OP}}})", "{{partition}}")]),
        Panel("Owner over time",
              "Which consumer held each partition's lease; gaps are partitions nobody held.",
              [(f"max by (partition, owner) (hubshift_partition_owner{{{OP}}}) == 1",
                "{{partition}}: {{owner}}")],
              kind="state-timeline", width=24, height=10, options=STATE),
        Row("Handoffs"),
        Panel("Handoff duration (operator: publication to new owner)",
              "From publishing a move to the new owner holding the partition: median and p95.",
              [(quantile(0.5, "hubshift_handoff_duration_seconds", "consumer"), "p50"),
               (quantile(0.95, "hubshift_handoff_duration_seconds", "consumer"), "p95")], unit="s"),
        Panel("Handoff duration (consumer: drain to release)",
              "A partition given away: from the start of its drain to its release, p95 per pod.",
              [(quantile(0.95, "hubshift_consumer_handoff_duration_seconds", pods), "{{pod}}")], unit="s"),
        Row("Consumers"),
        Panel("Events per second per pod", "Events processed and committed to the sink.",
              [(rate("hubshift_consumer_events_total", pods), "{{pod}}")], unit="ops"),
        Panel("Batch duration (p95)", "One batch, read to commit (Spark) or the handler (SDK engine).",
              [(quantile(0.95, "hubshift_consumer_batch_duration_seconds", pods), "{{pod}}")], unit="s"),
        Panel("Checkpoint age", "Seconds since each pod last wrote a checkpoint (its oldest partition).",
              [(f"max by (pod) (hubshift_consumer_checkpoint_age_seconds{{{OP}}})", "{{pod}}")], unit="s"),
        Panel("Owned partitions", "Partitions each pod owns now.",
              [(f"max by (pod) (hubshift_consumer_owned_partitions{{{OP}}})", "{{pod}}")]),
        Panel("Lease failures", "Membership renewals that failed and partition leases lost.",
              [(increase("hubshift_consumer_lease_renewals_total", pods, OP + ', result="failed"'),
                "{{pod}} renewals failed"),
               (increase("hubshift_consumer_lease_lost_total", pods), "{{pod}} leases lost")]),
        Panel("Spool depth", "Events received and spooled but not yet committed (Spark engine).",
              [(f"max by (pod) (hubshift_consumer_spool_events{{{OP}}})", "{{pod}}")]),
    ]  # fmt: skip
    return dashboard(
        "hubshift-consumer",
        "hubshift: one consumer",
        "One PartitionedConsumer: per-partition lag and owners, handoffs, and each consumer pod's "
        "throughput, batches, checkpoints, leases and spool.",
        items,
        multi=False,
    )


DASHBOARDS = {"hubshift-overview.json": overview, "hubshift-consumer.json": drilldown}


def render(build: Any) -> str:
    return json.dumps(build(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="fail when a file differs from what is written")
    args = parser.parse_args(argv)
    stale = []
    for name, build in DASHBOARDS.items():
        path, text = OUT / name, render(build)
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"out of date (run tools/dashboards.py): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
