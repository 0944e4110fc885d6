"""The demo's live terminal view: partitions, owners, backlog, replicas, phase and handoffs (rich)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from hubshift.operator.local.processes import ConsumerProcess, RecordedEvent
from hubshift.operator.loop import CycleReport
from hubshift.operator.partition_lag import PartitionLag
from hubshift.ownership.planner import sorted_partitions

PHASE_STYLE = {"Ready": "green", "Holddown": "yellow", "Rebalancing": "magenta"}


@dataclass(frozen=True)
class DemoFigures:
    """What the demo itself knows: time, load and output."""

    elapsed: float
    duration: float
    events_sent: int
    rate_now: float
    aggregated_events: int | None
    output: str


def render(
    report: CycleReport | None,
    processes: Sequence[ConsumerProcess],
    events: Sequence[RecordedEvent],
    figures: DemoFigures,
) -> RenderableType:
    """One frame of the view (pure: everything it shows is passed in)."""
    header = Text()
    header.append(f"hubshift demo  {figures.elapsed:5.0f}/{figures.duration:.0f} s   ", style="bold")
    header.append(f"load {figures.rate_now:5.0f} ev/s   sent {figures.events_sent}   ")
    if figures.aggregated_events is not None:
        header.append(f"aggregated {figures.aggregated_events}   ")
    header.append(f"output {figures.output}", style="dim")
    if report is None or (figures.elapsed == 0 and not report.status.ready_replicas):
        waiting = Text(
            "starting the consumers (a Spark driver takes a while); the load starts when one reads"
        )
        return Panel(Group(header, waiting), title="hubshift")

    status = report.status
    state = report.state
    phase = status.phase
    summary = Text()
    summary.append("phase ")
    summary.append(phase, style=f"bold {PHASE_STYLE.get(phase, 'white')}")
    summary.append(f"   generation {state.generation}")
    summary.append(
        f"   replicas desired {_n(status.desired_replicas)} / asked {_n(status.current_replicas)}"
        f" / ready {_n(status.ready_replicas)}"
    )
    summary.append(f"   backlog {_n(status.total_backlog)}")
    if status.lag_seconds is not None:
        summary.append(f"   lag {status.lag_seconds:.1f} s (partition {status.lagging_partition})")
    if status.holddown_until is not None:
        left = (status.holddown_until - datetime.now(UTC)).total_seconds()
        summary.append(f"   holddown {max(0.0, left):.0f} s", style="yellow")
    if status.pending_handoffs:
        summary.append(f"   handoffs pending {len(status.pending_handoffs)}", style="magenta")
    if report.decision is not None:
        summary.append(f"\nautoscaler: {report.decision.reason}", style="dim")

    return Panel(
        Group(header, summary, _partitions(report), _consumers(report, processes), _events(events)),
        title="hubshift",
        border_style=PHASE_STYLE.get(phase, "white"),
    )


def _partitions(report: CycleReport) -> Table:
    table = Table(title="partitions", title_justify="left", expand=False, pad_edge=False)
    table.add_column("partition", justify="right")
    table.add_column("owner (lease)")
    table.add_column("assigned")
    table.add_column("backlog", justify="right")
    table.add_column("lag (s)", justify="right")
    backlog = report.backlog or {}
    lag = report.lag or {}
    for partition in sorted_partitions(report.state.assignment):
        owner = report.owners.get(partition)
        assigned = report.state.assignment.get(partition)
        moving = owner != assigned
        table.add_row(
            partition,
            Text(owner or "-", style="dim" if owner is None else ""),
            Text(f"{assigned or '-'}{'  <- moving' if moving else ''}", style="magenta" if moving else ""),
            str(backlog.get(partition, "-")),
            _lag(lag.get(partition)),
        )
    return table


def _lag(lag: PartitionLag | None) -> str:
    return "-" if lag is None else ("?" if lag.seconds is None else f"{lag.seconds:.1f}")


def _consumers(report: CycleReport, processes: Sequence[ConsumerProcess]) -> Table:
    table = Table(title="consumers", title_justify="left", expand=False, pad_edge=False)
    table.add_column("consumer")
    table.add_column("pid", justify="right")
    table.add_column("state")
    table.add_column("partitions (assigned)")
    for process in processes:
        state = "stopping" if process.terminating else ("ready" if process.ready else "starting")
        parts = report.state.partitions_of(process.name)
        table.add_row(
            process.name,
            str(process.pid),
            Text(state, style={"ready": "green", "starting": "yellow"}.get(state, "red")),
            ",".join(parts) or "-",
        )
    return table


def _events(events: Sequence[RecordedEvent]) -> RenderableType:
    lines = Text()
    for event in list(events)[-6:]:
        moment = datetime.fromtimestamp(event.at, tz=UTC).strftime("%H:%M:%S")
        lines.append(f"{moment} {event.reason}: {event.message}\n", style="red" if event.warning else "")
    return Panel(lines or Text("no events yet", style="dim"), title="events", title_align="left")


def _n(value: int | None) -> str:
    return "-" if value is None else str(value)
