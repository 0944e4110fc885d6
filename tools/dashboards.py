"""Writes the Grafana dashboards in charts/hubshift/dashboards/ (plain JSON files, and the chart's
ConfigMaps): the fleet overview and the per-consumer drill-down. The panels are declared once here, so
every panel gets the same datasource variable, ids, grid and legend; `--check` fails when a file differs
from what this script writes (the unit tier runs it). docs/dashboards.md describes each panel.

`--schema` checks the files against Grafana's own dashboard schema, as the lint tier does: the
`Dashboard` type and each panel type's `Options` of the npm package @grafana/schema (Apache-2.0: the types
Grafana generates from its CUE schema; Grafana itself is AGPL and is never installed), turned into JSON
Schema by ts-json-schema-generator (MIT), both pinned and installed with npm into
${HUBSHIFT_CACHE:-~/.cache/hubshift}/grafana-schema-<version>/, then validated with jsonschema.

    .venv/bin/python tools/dashboards.py [--check] [--schema]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "charts" / "hubshift" / "dashboards"
SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
OP = 'namespace=~"$namespace", consumer=~"$consumer"'  # the selector every query carries
WIDTH = 24
GRAFANA_SCHEMA = "13.2.3"  # npm @grafana/schema (Apache-2.0)
SCHEMA_GENERATOR = "2.10.0"  # npm ts-json-schema-generator (MIT)


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
    """A query variable (`label_values(...)`): "All" by default when `multi`, else Grafana's first value."""
    current = {"current": {"selected": True, "text": ["All"], "value": ["$__all"]}} if multi else {}
    return {
        "name": name,
        "label": name,
        "type": "query",
        "datasource": DATASOURCE,
        "refresh": 2,
        "includeAll": multi,
        "multi": multi,
        **({"allValue": ".*"} if multi else {}),
        **current,
        "query": {"query": query, "refId": name},
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
            "options": item.options or LINES,
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
                    "hide": 0,
                },
                variable("namespace", "label_values(hubshift_partitions, namespace)", multi=True),
                # The pools reading a hub (or consumer group): `hub` and `consumer_group` label the
                # series about the hub's partitions.
                variable(
                    "hub", 'label_values(hubshift_partitions{namespace=~"$namespace"}, hub)', multi=True
                ),
                variable(
                    "consumer",
                    'label_values(hubshift_partitions{namespace=~"$namespace", hub=~"$hub"}, consumer)',
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


TOOLTIP = {"mode": "multi", "sort": "desc"}
LINES = {
    "legend": {"showLegend": True, "displayMode": "list", "placement": "bottom", "calcs": []},
    "tooltip": TOOLTIP,
}
STATE = {
    "showValue": "never",
    "mergeValues": True,
    "rowHeight": 0.9,
    "legend": {"showLegend": False, "displayMode": "list", "placement": "bottom", "calcs": []},
    "tooltip": TOOLTIP,
}


def overview() -> dict[str, Any]:
    by = "namespace, consumer"
    items: list[Panel | Row] = [
        Row("Lag"),
        Panel("Lag in seconds (worst partition)",
              "Age of the oldest unprocessed event in each PartitionedConsumer's worst partition; 0 when "
              "caught up. The operator's figure, and the consumers' own for the partitions they own "
              "(there while the operator is down).",
              [(f"max by ({by}) (hubshift_lag_seconds{{{OP}}})", "{{namespace}}/{{consumer}}"),
               (f"max by ({by}) (hubshift_consumer_lag_seconds{{{OP}}})",
                "{{namespace}}/{{consumer}} (consumers)")], unit="s"),
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
        Panel("Lag in seconds per partition",
              "Age of each partition's oldest unprocessed event: the operator's figure, and its owner's "
              "own (there while the operator is down).",
              [(f"max by (partition) (hubshift_partition_lag_seconds{{{OP}}})", "{{partition}}"),
               (f"max by (partition) (hubshift_consumer_lag_seconds{{{OP}}})", "{{partition}} (owner)")],
              unit="s"),
        Panel("Lag in events per partition", "Unprocessed events of each partition.",
              [(f"max by (partition) (hubshift_partition_backlog_events{{{OP}}})", "{{partition}}")]),
        Panel("Incoming load per consumer",
              "Events enqueued per second on the partitions each consumer holds (each partition's rate "
              "from the hub, summed by its lease owner): what loadAware assignment evens out.",
              [("sum by (owner) (max by (partition) "
                f"(hubshift_partition_load_events_per_second{{{OP}}}) * on (partition) group_left (owner) "
                "topk by (partition) (1, max by (partition, owner) "
                f"(hubshift_partition_owner{{{OP}}}) == 1))",
                "{{owner}}")],
              unit="ops"),
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
        Row("Spark and its JVM (Spark engine)"),
        Panel("JVM heap per pod", "The Spark driver JVM's heap: used, and the most it may grow to.",
              [(f"max by (pod) (hubshift_consumer_jvm_memory_{kind}_bytes{{{OP}, area=\"heap\"}})",
                f"{{{{pod}}}} {kind}") for kind in ("used", "max")],
              unit="bytes", width=8),
        Panel("JVM time in garbage collection",
              "Share of the time the Spark driver JVM spent collecting garbage, per pod and collector.",
              [(rate("hubshift_consumer_jvm_gc_collection_seconds_total", "pod, gc"), "{{pod}} {{gc}}")],
              unit="percentunit", width=8),
        Panel("Spark micro-batches",
              "Spark's own micro-batch duration (p95) and its input and processing rates, per pod.",
              [(quantile(0.95, "hubshift_consumer_spark_batch_duration_seconds", pods), "{{pod}} p95 (s)"),
               *[(f"max by (pod) (hubshift_consumer_spark_{kind}_rows_per_second{{{OP}}})",
                  f"{{{{pod}}}} {kind} rows/s") for kind in ("input", "processed")]],
              width=8),
    ]  # fmt: skip
    return dashboard(
        "hubshift-consumer",
        "hubshift: one consumer",
        "One PartitionedConsumer: per-partition lag and owners, handoffs, and each consumer pod's "
        "throughput, batches, checkpoints, leases and spool, its Spark micro-batches and JVM.",
        items,
        multi=False,
    )


DASHBOARDS = {"hubshift-overview.json": overview, "hubshift-consumer.json": drilldown}


def render(build: Any) -> str:
    return json.dumps(build(), indent=2) + "\n"


def schema_path() -> Path:
    """Where `schema_folder` keeps the schemas (`.made` in it once they are complete)."""
    cache = Path(os.environ.get("HUBSHIFT_CACHE", Path.home() / ".cache" / "hubshift"))
    return cache / f"grafana-schema-{GRAFANA_SCHEMA}-{SCHEMA_GENERATOR}"


def schema_folder() -> Path:
    """Grafana's dashboard and panel option schemas as JSON Schema, made once per pinned version."""
    folder = schema_path()
    done = folder / ".made"
    if done.exists():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists():
            return folder
        npm = shutil.which("npm")
        if npm is None:
            raise SystemExit("npm is needed to install @grafana/schema and ts-json-schema-generator")
        packages = [f"@grafana/schema@{GRAFANA_SCHEMA}", f"ts-json-schema-generator@{SCHEMA_GENERATOR}"]
        install = [npm, "install", "--prefix", str(folder), "--no-audit", "--no-fund", "--loglevel=error"]
        subprocess.run([*install, *packages], check=True, stdout=subprocess.DEVNULL)
        types = folder / "node_modules" / "@grafana" / "schema" / "dist" / "types" / "raw"
        wanted = {"dashboard": (types / "dashboard" / "x" / "types.gen.d.ts", "Dashboard")}
        for panel in sorted({"timeseries", "statetimeline"}):
            wanted[f"options-{panel}"] = (
                types / "composable" / panel / "panelcfg" / "x" / "types.gen.d.ts",
                "Options",
            )
        generator = folder / "node_modules" / ".bin" / "ts-json-schema-generator"
        for name, (source, type_name) in wanted.items():
            subprocess.run(
                [str(generator), "--path", str(source), "--type", type_name, "--no-type-check",
                 "-o", str(folder / f"{name}.schema.json")],
                check=True, cwd=folder, stdout=subprocess.DEVNULL,
            )  # fmt: skip
        done.touch()
    return folder


def schema_errors(dashboard: dict[str, Any], folder: Path) -> list[str]:
    """Where `dashboard` breaks Grafana's `Dashboard` schema: the dashboard, each panel as its kind (a
    `RowPanel` or a `Panel`), and each panel's options as its type's `Options`."""
    import jsonschema

    def schema(name: str, definition: str | None = None) -> dict[str, Any]:
        loaded: dict[str, Any] = json.loads((folder / f"{name}.schema.json").read_text())
        return loaded if definition is None else {**loaded, "$ref": f"#/definitions/{definition}"}

    def errors(document: Any, against: dict[str, Any], where: str) -> list[str]:
        return [
            f"{where}{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in jsonschema.Draft7Validator(against).iter_errors(document)
        ]

    found = errors({**dashboard, "panels": []}, schema("dashboard"), "")
    for number, panel in enumerate(dashboard["panels"]):
        where = f"panels/{number} ({panel.get('title')!r}): "
        if panel.get("type") == "row":
            found += errors(panel, schema("dashboard", "RowPanel"), where)
            continue
        found += errors(panel, schema("dashboard", "Panel"), where)
        options = f"options-{str(panel.get('type')).replace('-', '')}"
        found += errors(panel.get("options"), schema(options), f"{where}options/")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="fail when a file differs from what is written")
    parser.add_argument("--schema", action="store_true", help="check the files against Grafana's schema")
    args = parser.parse_args(argv)
    if args.schema:
        folder = schema_folder()
        invalid = [
            f"{path.name}: {error}"
            for path in sorted(OUT.glob("*.json"))
            for error in schema_errors(json.loads(path.read_text()), folder)
        ]
        if invalid:
            print("against Grafana's dashboard schema:\n" + "\n".join(invalid), file=sys.stderr)
            return 1
        count = len(list(OUT.glob("*.json")))
        print(f"{count} dashboards match Grafana's schema (@grafana/schema {GRAFANA_SCHEMA})")
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
