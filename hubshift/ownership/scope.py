"""Where one hub's consumer group keeps its records, and the names of those records.

Names follow the Azure SDKs' blob checkpoint store (`<fqns>/<hub>/<cg>/checkpoint/<partition>`, all lower
case), so the SDK, KEDA and lag tools read hubshift's checkpoints unchanged.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

# Lease ids are derived, not random, so a restarted consumer with the same identity holds the same id.
_LEASE_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://hubshift.dev/ownership/lease")
_CONSUMER_RE = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,251}[a-z0-9])?$")

CHECKPOINT = "checkpoint/"
MEMBERS = "hubshift/consumers/"
ASSIGNMENT = "hubshift/assignment"


@dataclass(frozen=True)
class Scope:
    """One Event Hub consumer group: `fqns` is the fully qualified Event Hubs namespace."""

    fqns: str
    hub: str
    consumer_group: str

    def __post_init__(self) -> None:
        for field_name in ("fqns", "hub", "consumer_group"):
            value = str(getattr(self, field_name)).strip().lower()
            if not value or "/" in value:
                raise ValueError(f"{field_name} must be non-empty and contain no '/': {value!r}")
            object.__setattr__(self, field_name, value)

    @property
    def prefix(self) -> str:
        """Every record of this scope starts with it: `<fqns>/<hub>/<cg>/`."""
        return f"{self.fqns}/{self.hub}/{self.consumer_group}/"

    @property
    def checkpoint_prefix(self) -> str:
        return self.prefix + CHECKPOINT

    @property
    def members_prefix(self) -> str:
        return self.prefix + MEMBERS

    @property
    def assignment_blob(self) -> str:
        return self.prefix + ASSIGNMENT

    def checkpoint_blob(self, partition: str) -> str:
        return self.checkpoint_prefix + partition_id(partition)

    def member_blob(self, consumer: str) -> str:
        return self.members_prefix + consumer_id(consumer)

    def lease_id(self, consumer: str) -> str:
        """The lease id `consumer` uses on every blob of this scope: the same after every restart."""
        return str(uuid.uuid5(_LEASE_NAMESPACE, self.prefix + consumer_id(consumer)))

    def __str__(self) -> str:
        return self.prefix.rstrip("/")


def consumer_id(consumer: str) -> str:
    """A consumer's identity, normalised (lower case, DNS-label-like, as a StatefulSet pod name is)."""
    value = consumer.strip().lower()
    if not _CONSUMER_RE.match(value):
        raise ValueError(
            f"consumer identity {consumer!r} must be letters, digits, '.', '_' or '-' "
            "(starting and ending with a letter or digit)"
        )
    return value


def partition_id(partition: str | int) -> str:
    value = str(partition).strip().lower()
    if not value or "/" in value:
        raise ValueError(f"partition id must be non-empty and contain no '/': {value!r}")
    return value
