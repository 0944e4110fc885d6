"""A second process for the ownership tests: reads JSON commands on stdin, answers one JSON line each.

Run by `tests/fixtures/ownership.py::Worker`; the store comes from $HUBSHIFT_TEST_STORE (it may hold a key).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from typing import Any

from hubshift.ownership.assignment import publish_assignment, read_assignment
from hubshift.ownership.checkpoints import write_checkpoint
from hubshift.ownership.leases import claim_partition, release_partition
from hubshift.ownership.membership import Membership, join_pool, renew
from hubshift.ownership.model import Assignment, Checkpoint, PartitionLease, Phase
from hubshift.ownership.scope import Scope
from hubshift.ownership.store import StoreError
from hubshift.ownership.stores.locations import open_store
from hubshift.ownership.timing import Timing

SCOPE = Scope("test.servicebus.windows.net", "hub", "$default")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--container", required=True)
    parser.add_argument("--clock-offset", type=float, default=0.0)
    args = parser.parse_args()
    offset = args.clock_offset
    store = open_store(os.environ["HUBSHIFT_TEST_STORE"], args.container, clock=lambda: time.time() + offset)
    leases: dict[str, PartitionLease] = {}
    members: dict[str, Membership] = {}

    def run(command: str, a: dict[str, Any]) -> dict[str, Any]:
        if command == "ping":
            return {}
        if command == "join":
            timing = Timing(membership_lease_seconds=a.get("lease_seconds", 30), renew_interval_seconds=5)
            members[a["consumer"]] = join_pool(
                store, SCOPE, a["consumer"], clock=time.monotonic, timing=timing
            )
            return {}
        if command == "renew":
            members[a["consumer"]] = renew(store, members[a["consumer"]], clock=time.monotonic)
            return {"lapsed": members[a["consumer"]].lapsed}
        if command == "claim":
            lease = claim_partition(store, SCOPE, a["partition"], a["consumer"], force=a.get("force", False))
            leases[lease.partition] = lease
            return {
                "owner_level": lease.owner_level,
                "offset": lease.checkpoint.offset,
                "sequence_number": lease.checkpoint.sequence_number,
            }
        if command == "checkpoint":
            position = Checkpoint(str(a["offset"]), int(a["sequence_number"]))
            leases[a["partition"]] = write_checkpoint(store, leases[a["partition"]], position)
            return {}
        if command == "release":
            return {"released": release_partition(store, leases.pop(a["partition"]))}
        if command == "read_assignment":
            record = read_assignment(store, SCOPE)
            return {"etag": None if record is None else record.etag}
        if command == "publish":
            assignment = Assignment(
                generation=a["generation"],
                partitions=a["partitions"],
                phase=Phase.READY,
                replicas=len(set(a["partitions"].values())),
                updated_at=datetime.now(UTC),
            )
            return {"etag": publish_assignment(store, SCOPE, assignment, etag=a["etag"])}
        raise ValueError(f"unknown command {command}")

    for line in sys.stdin:
        request = json.loads(line)
        command = request.pop("command")
        if command == "exit":
            print(json.dumps({"ok": True}), flush=True)
            break
        try:
            reply = {"ok": True, **run(command, request)}
        except StoreError as exc:
            reply = {"ok": False, "error": type(exc).__name__, "message": str(exc)}
        print(json.dumps(reply), flush=True)
    store.close()


if __name__ == "__main__":
    main()
