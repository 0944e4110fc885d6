"""Where a planned handoff's time goes: hubshift's local runtime over `hubshift consume --engine sdk`
processes on the emulator and Azurite, a steady load (the rollout scenarios' sensor load), the pool's size
changed up and down by the spec (planned changes: each new consumer's share handed over when it is ready, a
leaving consumer's share handed to the others), and every handoff taken apart from the consumers' own log
lines and range logs.

Per handoff of partition p from consumer A to consumer B:
- `lastBatchToDrain`: A's last batch of p (its range log) to A starting the drain (`handing off`) —
  negative when that batch is the drain's own last read (the events that came since the batch before);
- `drain`: to A's release (`handed off at`: the batch in hand finished, the link's last read delivered, the
  final checkpoint written, the lease released);
- `releaseToClaim`: to B's claim (`claimed`: B saw the release in a listing and took the lease);
- `claimToFirstBatch`: to B's first batch of p (B's receiver opened and the events delivered and handled);
- `gap`: from A's last batch to B's first (`tests/harness/ranges.handoffs`: the figure the rollout scenarios
  report), and `drainToFirstBatch`, the handoff proper.
Per change: the worst wait of any event handled in the `--settle` seconds after it (a batch's handling time
minus its first event's enqueued time), against the steady worst wait over the `--steady` seconds before the
first change; over the run, the events sent, handled (every one, or the run exits 1 naming how many are
missing: a handoff lost them) and replayed.

There is no peer here: this takes hubshift's own path apart (bench/rebalance.py compares planned changes with
the Azure SDK's processor, the node and kind tiers' rollout scenarios with the StatefulSet's rolling update).
Log times are the consumers' (milliseconds), range-log times the same clock: one machine.

    .venv/bin/python bench/handoff.py [--partitions 8] [--rate 160] [--sizes 2,3,4,3,2] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.harness.azurite import start_azurite
from tests.harness.ranges import count_replays, handoffs, percentile, read_range_logs, worst_wait

RESULTS = Path(__file__).resolve().parent / "results" / "handoff.json"
HUB = "handoff"
# After the load stops, the consumers have this long to handle every event sent.
CATCH_UP_SECONDS = 60.0
CONTAINER = "handoff"
# A consumer's log line: its time, then hubshift's message about one partition.
LINE = re.compile(
    r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \w+ \S+: partition (?P<p>\d+)"
    r"(?::\s(?P<verb>claimed|handing off)| (?P<handed>handed off at))"
)


@dataclass(frozen=True)
class Mark:
    at: float  # wall-clock seconds
    consumer: str
    partition: str
    what: str  # "drain", "released", "claimed"


def manifest(replicas: int, output: Path) -> dict[str, Any]:
    return {
        "apiVersion": "hubshift.dev/v1alpha1",
        "kind": "PartitionedConsumer",
        "metadata": {"name": "handoff"},
        "spec": {
            "eventHubs": {"hub": HUB},
            "checkpointStore": {"blob": {"container": CONTAINER}},
            "consumer": {
                "checkpoint": {"everySeconds": 2},
                "sink": {"type": "folder", "folder": {"path": str(output)}},
            },
            "scaling": {"minReplicas": replicas, "maxReplicas": replicas, "pollingIntervalSeconds": 2},
            "rebalance": {"delaySeconds": 5, "maxHandoffSeconds": 15},
        },
    }


def read_marks(logs: Path) -> list[Mark]:
    """Every drain, release and claim the consumers logged, in time order."""
    marks = []
    for path in sorted(logs.glob("*.log")):
        for text in path.read_text(errors="replace").splitlines():
            found = LINE.match(text)
            if found is None:
                continue
            at = datetime.strptime(found["at"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            what = (
                "released"
                if found["handed"]
                else {"claimed": "claimed", "handing off": "drain"}[found["verb"]]
            )
            marks.append(Mark(at, path.stem, found["p"], what))
    return sorted(marks, key=lambda m: m.at)


def take_apart(marks: list[Mark], lines: list[dict[str, Any]], since: float) -> list[dict[str, Any]]:
    """Each handoff after `since` whose drain, release and claim were all logged."""
    batches: dict[str, list[tuple[float, str]]] = {}
    for line in lines:
        batches.setdefault(str(line["partition"]), []).append((float(line["at"]), str(line["consumer"])))
    rows = []
    for claim in (m for m in marks if m.what == "claimed" and m.at >= since):
        before = [
            m
            for m in marks
            if m.partition == claim.partition and m.at <= claim.at and m.consumer != claim.consumer
        ]
        drain = next((m for m in reversed(before) if m.what == "drain"), None)
        released = next((m for m in reversed(before) if m.what == "released"), None)
        if drain is None or released is None or released.at < drain.at or drain.at < since:
            continue  # a first claim, or one the log does not explain (a forced or lost partition)
        own = batches.get(claim.partition, [])
        last = max((at for at, who in own if at <= released.at and who == drain.consumer), default=None)
        first = min((at for at, who in own if at >= claim.at and who == claim.consumer), default=None)
        if last is None or first is None:
            continue
        rows.append(
            {
                "partition": claim.partition,
                "from": drain.consumer,
                "to": claim.consumer,
                "lastBatchToDrain": round(drain.at - last, 3),
                "drain": round(released.at - drain.at, 3),
                "releaseToClaim": round(claim.at - released.at, 3),
                "claimToFirstBatch": round(first - claim.at, 3),
                "drainToFirstBatch": round(first - drain.at, 3),
                "gap": round(first - last, 3),
            }
        )
    return rows


def summary(values: list[float]) -> dict[str, float | None]:
    return {
        "p50": percentile(values, 0.5),
        "p99": percentile(values, 0.99),
        "max": max(values) if values else None,
    }


async def run(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    sizes = [int(size) for size in args.sizes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="hubshift-bench-handoff-"))
    try:
        changes, sent = await drive(args, console, sizes, work)
        return figures(args, sizes, changes, work, sent)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


async def drive(
    args: argparse.Namespace, console: Console, sizes: list[int], work: Path
) -> tuple[list[tuple[float, int]], int]:
    """The pool under load through `sizes`, one change after another: when each change was applied, and
    how many events were sent."""
    from azure.storage.blob import BlobServiceClient

    from hubshift.apps.produce import LoadSpec, ProduceSummary, send_load
    from hubshift.emulator.launch import start_emulator
    from hubshift.manifest import parse_manifest
    from hubshift.operator.local.runner import LocalOperator
    from hubshift.spec import DEFAULT_EVENTHUBS_ENV, DEFAULT_STORAGE_ENV

    # A SIGTERM (a run stopped early) cancels the run, so everything it started is stopped below.
    main_task = asyncio.current_task()
    if main_task is not None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)
    emulator = start_emulator([f"{HUB}:{args.partitions}"])
    azurite = None
    stop_load = threading.Event()
    operator: LocalOperator | None = None
    try:
        azurite = start_azurite(work / "azurite")
        with BlobServiceClient.from_connection_string(azurite.connection_string) as service:
            service.create_container(CONTAINER)
        environ = dict(
            os.environ,
            **{
                DEFAULT_EVENTHUBS_ENV: emulator.connection_string,
                DEFAULT_STORAGE_ENV: azurite.connection_string,
            },
        )
        output = work / "out"
        path = work / "manifest.yaml"
        document = manifest(sizes[0], output)
        path.write_text(yaml.safe_dump(document))
        operator = LocalOperator(path, parse_manifest(document), work / "run", engine="sdk", environ=environ)
        await operator.open()
        stop = asyncio.Event()
        task = asyncio.get_running_loop().create_task(operator.run(stop))

        spec = LoadSpec(homes=300, rate=args.rate, seed=1, interval=0.2)
        rounds: list[ProduceSummary] = []  # the sender's running summary (its last round's is the total)
        load = threading.Thread(
            target=send_load,
            args=(emulator.connection_string, HUB, spec),
            kwargs={"stop": stop_load, "on_round": rounds.append},
            name="load",
            daemon=True,
        )
        load.start()
        console.print(f"{sizes[0]} consumers, {args.rate:g} events/s over {args.partitions} partitions")
        await asyncio.sleep(args.steady + 10)  # joined, claimed, steady
        changes: list[tuple[float, int]] = []
        for size in sizes[1:]:
            changes.append((time.time(), size))
            operator.apply(parse_manifest(manifest(size, output)))
            console.print(f"  -> {size} consumers")
            await asyncio.sleep(args.settle)
        stop_load.set()
        load.join(timeout=30)
        sent = rounds[-1].events if rounds else 0
        deadline = time.monotonic() + CATCH_UP_SECONDS
        while time.monotonic() < deadline:  # every event sent handled (or the figures say what is missing)
            if count_replays(read_range_logs(output / "ranges"))[0] >= sent:
                break
            await asyncio.sleep(0.5)
        stop.set()
        await asyncio.wait_for(task, 30)
    finally:
        stop_load.set()
        if operator is not None:
            await operator.shutdown(grace=20)
        emulator.stop()
        if azurite is not None:
            azurite.stop()
    return changes, sent


def figures(
    args: argparse.Namespace, sizes: list[int], changes: list[tuple[float, int]], work: Path, sent: int
) -> dict[str, Any]:
    """The run's figures from its consumers' logs and range logs (module docstring)."""
    lines = read_range_logs(work / "out" / "ranges")
    first_change = changes[0][0]
    rows = take_apart(read_marks(work / "run" / "logs"), lines, first_change)
    steady = worst_wait(lines, first_change - args.steady, first_change)
    per_change = [
        {"to": size, "worstWaitDuring": worst_wait(lines, at, at + args.settle)} for at, size in changes
    ]
    parts = ("lastBatchToDrain", "drain", "releaseToClaim", "claimToFirstBatch", "drainToFirstBatch", "gap")
    distinct, replayed = count_replays(lines)
    return {
        "partitions": args.partitions,
        "rate": args.rate,
        "sizes": sizes,
        "handoffs": len(rows),
        "rangeLogHandoffs": len(handoffs(lines, first_change)),
        "parts": {part: summary([row[part] for row in rows]) for part in parts},
        "steadyWorstWait": steady,
        "changes": per_change,
        "withinTwiceSteady": all(
            c["worstWaitDuring"] is not None and steady is not None and c["worstWaitDuring"] <= 2 * steady
            for c in per_change
        ),
        "sent": sent,
        "events": distinct,
        "missing": sent - distinct,
        "replayed": replayed,
        "rows": rows,
    }


def report(result: dict[str, Any], console: Console) -> None:
    from rich.table import Table

    table = Table(title=f"{result['handoffs']} planned handoffs (seconds)")
    for column in ("part", "p50", "p99", "max"):
        table.add_column(column)
    for part, values in result["parts"].items():
        table.add_row(
            part, *(f"{values[k]:.3f}" if values[k] is not None else "-" for k in ("p50", "p99", "max"))
        )
    console.print(table)
    waits = ", ".join(
        f"{c['worstWaitDuring']:.2f}" for c in result["changes"] if c["worstWaitDuring"] is not None
    )
    console.print(
        f"worst wait during each change: {waits} s; steady {result['steadyWorstWait']:.2f} s; "
        f"{result['events']} of {result['sent']} events handled, {result['replayed']} replayed"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--rate", type=float, default=160.0, help="events/s")
    parser.add_argument("--sizes", default="2,3,4,3,2", help="the pool's sizes, one change after another")
    parser.add_argument("--steady", type=float, default=10.0, help="seconds of steady state measured first")
    parser.add_argument("--settle", type=float, default=15.0, help="seconds after each change")
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument(
        "--keep", action="store_true", help="keep the work folder (consumer logs, range logs)"
    )
    args = parser.parse_args(argv)
    console = Console()
    started = time.monotonic()
    try:
        result = asyncio.run(run(args, console))
    except asyncio.CancelledError:
        console.print("stopped (SIGTERM): nothing written")
        return 143
    result["seconds"] = round(time.monotonic() - started)
    report(result, console)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1))
    console.print(f"wrote {args.output} ({result['seconds']} s)")
    if result["missing"]:
        console.print(f"[red]{result['missing']} events sent were never handled: a handoff lost them[/]")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
