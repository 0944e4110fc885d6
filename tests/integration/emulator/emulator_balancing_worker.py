"""One consumer process of the load-balancing test: the SDK's EventProcessor (EventHubConsumerClient with
BlobCheckpointStore), checkpointing every event, appending `partition,sequence,body` lines to a file.

usage: python emulator_balancing_worker.py EVENTHUB_CONNECTION_STRING BLOB_CONNECTION_STRING CONTAINER OUTPUT
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

from azure.eventhub import EventData, EventHubConsumerClient
from azure.eventhub.extensions.checkpointstoreblob import BlobCheckpointStore


def main() -> None:
    eventhub, blob, container, output_path = sys.argv[1:5]
    store = BlobCheckpointStore.from_connection_string(blob, container)
    client = EventHubConsumerClient.from_connection_string(
        eventhub,
        consumer_group="$Default",
        eventhub_name="hub",
        checkpoint_store=store,
        load_balancing_interval=1,
        partition_ownership_expiration_interval=6,
    )
    output = Path(output_path).open("a", buffering=1)  # noqa: SIM115 - open for the life of the process

    def on_event(context: Any, event: EventData | None) -> None:
        if event is None:
            return
        output.write(f"{context.partition_id},{event.sequence_number},{event.body_as_str()}\n")
        context.update_checkpoint(event)

    signal.signal(signal.SIGTERM, lambda *_: client.close())
    with client:
        client.receive(on_event=on_event, starting_position="-1")


if __name__ == "__main__":
    main()
