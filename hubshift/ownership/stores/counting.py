"""A `LeaseStore` that counts the requests made through it, by kind (the control loop reports them; the
benchmarks and tests read them)."""

from __future__ import annotations

from typing import Any

from hubshift.ownership.store import LeaseStore


class CountingStore:
    """A `LeaseStore` wrapper that counts requests by kind (the benchmark's and the tests' meter)."""

    def __init__(self, store: LeaseStore) -> None:
        self.store = store
        self.counts: dict[str, int] = {}

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.store, name)
        if not callable(attribute) or name == "close":
            return attribute

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.counts[name] = self.counts.get(name, 0) + 1
            return attribute(*args, **kwargs)

        return counted

    @property
    def total(self) -> int:
        return sum(self.counts.values())
