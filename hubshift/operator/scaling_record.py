"""The autoscaler's memory between cycles and across operator restarts: its `ScalingState` (stabilisation
windows, scale events) as one small JSON blob in the pool's scope (`<scope>/hubshift/autoscaler`),
written with compare-and-swap only when it changed."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from hubshift.operator.autoscaler import ScalingState
from hubshift.ownership.scope import Scope
from hubshift.ownership.store import BlobNotFound, LeaseStore, StoreError, WriteConflict

log = logging.getLogger(__name__)

AUTOSCALER_RECORD = "hubshift/autoscaler"  # under the scope's prefix


class ScalingRecord:
    """Load once, then save whenever the state changed (the store runs in a worker thread)."""

    def __init__(self, store: LeaseStore, scope: Scope) -> None:
        self.store = store
        self.scope = scope
        self.name = scope.prefix + AUTOSCALER_RECORD
        self._saved: dict[str, Any] | None = None
        self._etag: str | None = None

    async def load(self) -> ScalingState | None:
        """The saved state, or None (none yet, or unreadable: the autoscaler starts afresh)."""
        try:
            data, etag = await asyncio.to_thread(self.store.read, self.name)
            state = ScalingState.from_dict(json.loads(data))
        except BlobNotFound:
            return None
        except (StoreError, ValueError, TypeError) as exc:
            log.warning(
                "%s: the autoscaler's saved state is unreadable (%s): starting afresh", self.scope, exc
            )
            return None
        self._saved, self._etag = state.to_dict(), etag
        return state

    async def save(self, state: ScalingState) -> None:
        document = state.to_dict()
        if document == self._saved:
            return
        data = json.dumps(document).encode()
        try:
            self._etag = await asyncio.to_thread(self.store.write, self.name, data, etag=self._etag)
            self._saved = document
        except WriteConflict:
            # Another operator wrote it (or it is gone): take its ETag, write ours next cycle.
            try:
                _, self._etag = await asyncio.to_thread(self.store.read, self.name)
            except BlobNotFound:
                self._etag = None
        except StoreError as exc:
            log.warning("%s: could not save the autoscaler's state: %s", self.scope, exc)
