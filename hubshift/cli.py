"""The `hubshift` command: one entry point, one subcommand per part.

Subcommands are imported only when invoked, so `hubshift status` does not pay for PySpark or kopf.
"""

from __future__ import annotations

import importlib
import sys

import click

from hubshift import __version__
from hubshift.errors import UserError

# name -> "module:attribute" of a click command
SUBCOMMANDS: dict[str, str] = {
    "emulator": "hubshift.emulator.cli:emulator",
    "status": "hubshift.apps.status:status",
    "consume": "hubshift.consumer.cli:consume",
    "produce": "hubshift.apps.produce:produce",
    "run": "hubshift.operator.local.cli:run",
    "demo": "hubshift.apps.demo:demo",
    "operator": "hubshift.operator.cli:operator",
    "views": "hubshift.apps.views:views",
    "checkpoints": "hubshift.apps.checkpoints:checkpoints",
    "release": "hubshift.apps.checkpoints:release",
}

HELP = {
    "emulator": "Start a local Event Hubs that the azure-eventhub SDK talks to.",
    "status": "Show partition owners, checkpoints, the assignment and its phase.",
    "consume": "Run one consumer (a pod's entry point).",
    "produce": "Send a home-security sensor load to an Event Hub.",
    "run": "Run a PartitionedConsumer manifest on this machine (local runtime).",
    "demo": "The whole system on this machine with embedded defaults.",
    "operator": "Run the Kubernetes operator.",
    "views": "Write the aggregate's window totals as JSON files for a web page.",
    "checkpoints": "Show a consumer group's checkpoints, or move them (start, end, time, sequence number).",
    "release": "End hubshift's ownership so the Azure SDK's processor or Functions take the group over.",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = SUBCOMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attribute = target.split(":")
        command: click.Command = getattr(importlib.import_module(module_name), attribute)
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, HELP.get(name, "")) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hubshift")
def cli() -> None:
    """hubshift: partition-aware PySpark consumers for Azure Event Hubs."""


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="hubshift", standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except UserError as exc:
        for line in str(exc).splitlines() or [""]:  # a manifest's problems: all of them, one line each
            click.echo(f"hubshift: error: {line}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
