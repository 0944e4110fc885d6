"""`hubshift views -f MANIFEST`: project the aggregate pipeline's committed counts into the sink's `views/`
folder, the files a static web page reads (`pipelines/aggregate_view.py` describes them).

The consumers write partial counts per batch; any number of them may write into one sink, so the views are
projected from one place: this command, once (`--every 0`, the default: a Kubernetes CronJob or a cron
line), or every N seconds until Ctrl-C or `--duration`. Each pass reads only the commit records it has not
seen and rewrites the views whole, so a window is exact after handoffs and replays.

`--serve PORT` also serves the residents' page (`views_page.py`) with the views on 127.0.0.1:PORT, and
projects every 5 seconds unless `--every` says otherwise.
"""

from __future__ import annotations

import time

import click

from hubshift.apps.views_page import ViewsServer
from hubshift.connections import chosen_identity, credential_options
from hubshift.errors import UserError
from hubshift.manifest import load_manifest, with_credential
from hubshift.pipelines.aggregate_view import AggregateView
from hubshift.sinks import build_store
from hubshift.spec.connections import Role

# --credential reaches only the sink: the one connection this command opens.
SINK_ONLY: tuple[Role, ...] = ("sink",)
# With --serve and no --every: project this often, so the page shows new windows.
SERVE_EVERY_SECONDS = 5.0


@click.command(name="views")
@click.option("-f", "--file", "manifest_path", required=True, help="The PartitionedConsumer manifest (YAML).")
@click.option(
    "--every",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Seconds between passes; 0 writes the views once and exits.",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=0),
    default=None,
    help="With --every: stop after this many seconds (default: until Ctrl-C).",
)
@click.option(
    "--serve",
    "serve_port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Also serve the residents' page with the views on 127.0.0.1:PORT (0: a free port).",
)
@credential_options(
    "Read the sink with this token credential instead of its connection string (the manifest names the "
    "account URL)"
)
def views(
    manifest_path: str,
    every: float,
    duration: float | None,
    serve_port: int | None,
    credential: str | None,
    client_id: str | None,
) -> None:
    """Write the aggregate's window totals as JSON for a web page (views/index.json, one file per window);
    with --serve, also serve the residents' page that reads them."""

    consumer = load_manifest(manifest_path)
    chosen = chosen_identity(credential, client_id)
    if chosen is not None:
        consumer = with_credential(consumer, chosen, roles=SINK_ONLY)
    pipeline = consumer.spec.consumer.pipeline
    if pipeline.type != "aggregate":
        raise UserError(
            f"{manifest_path}: views are projected from the aggregate pipeline's counts; this manifest's "
            f"pipeline is {pipeline.type!r}"
        )
    # As the consumer opens it: a bad folder, connection string or credentials fail here, in one line.
    view = AggregateView(build_store(consumer.spec.consumer.sink, check=True))
    ends = None if duration is None else time.monotonic() + duration
    server = None
    if serve_port is not None:
        try:
            server = ViewsServer(view.store, serve_port).start()
        except OSError as exc:
            raise UserError(f"--serve {serve_port}: {exc.strerror or exc}") from None
        click.echo(f"views: the residents' page is at {server.url}")
        every = every or SERVE_EVERY_SECONDS
    try:
        while True:
            fresh = _project(view)
            click.echo(
                f"views: {len(view.windows())} windows, {view.total()} events "
                f"({fresh} new batches, {len(view.records)} in all)"
            )
            if every <= 0 or (ends is not None and time.monotonic() + every > ends):
                return
            time.sleep(every)
    except KeyboardInterrupt:
        return
    finally:
        if server is not None:
            server.close()


def _project(view: AggregateView) -> int:
    """One pass: new commit records in, every view rewritten; how many records were new."""
    from azure.core.exceptions import AzureError

    try:
        fresh = view.refresh()
        view.write_views()
    except (OSError, AzureError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise UserError(f"views: cannot read or write {view.store.describe()}: {reason}") from None
    return fresh
