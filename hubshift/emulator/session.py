"""One AMQP session (begin ... end) on a connection: its channel numbers, the links attached on it by the
peer's handle and the handles it gives them, delivery ids, the flow window, and the replies of `$cbs` and
`$management` routed to the session's reply link for that node."""

from __future__ import annotations

import heapq
from typing import Protocol

from hubshift.emulator.cbs import Entity
from hubshift.emulator.codec import Buffer, Described, UInt
from hubshift.emulator.context import ProtocolViolation
from hubshift.emulator.performatives import Flow, Performative, Transfer
from hubshift.emulator.wire import Wire

SESSION_WINDOW = 2**31 - 1


class SessionLink(Protocol):
    """A link as its session and connection handle it (`links.Link`)."""

    handle: int
    detached: bool
    # the entity an event link reads or writes, its address and the right it needs (SEND or LISTEN; None,
    # "": a $cbs or $management link)
    entity: Entity | None
    address: str
    right: str

    def on_flow(self, flow: Flow) -> None: ...

    def on_transfer(self, transfer: Transfer, payload: memoryview) -> None: ...

    def on_peer_detach(self, closed: bool) -> None: ...

    def detach(self, error: Described | None) -> None: ...

    def release(self) -> None: ...


class ReplySink(Protocol):
    """The link a node's replies go out on (`requests.ReplyLink`)."""

    detached: bool

    def send_message(self, message: bytes) -> None: ...


class Session:
    def __init__(self, connection: Wire, local_channel: int, remote_channel: int) -> None:
        self.connection = connection
        self.local_channel = local_channel
        self.remote_channel = remote_channel
        # the attached links by the peer's handle
        self.links: dict[int, SessionLink] = {}
        self._handles_in_use: set[int] = set()
        self._free_handles: list[int] = []  # a heap: the lowest released handle is given out first
        self._next_handle = 0
        self.next_delivery_id = 0
        self.next_outgoing_id = 0
        self.next_incoming_id = 0
        self.reply_links: dict[str, ReplySink] = {}
        self.pending_replies: dict[str, list[bytes]] = {}

    def allocate_handle(self) -> int:
        """A handle of ours for a new link."""
        if self._free_handles:
            handle = heapq.heappop(self._free_handles)
        else:
            handle = self._next_handle
            self._next_handle += 1
        self._handles_in_use.add(handle)
        return handle

    def release_handle(self, handle: int) -> None:
        if handle in self._handles_in_use:
            self._handles_in_use.remove(handle)
            heapq.heappush(self._free_handles, handle)

    def add_link(self, remote_handle: int, link: SessionLink) -> None:
        self.links[remote_handle] = link
        self.connection.link_count += 1

    def pop_link(self, remote_handle: int) -> SessionLink | None:
        """The link the peer's handle names, no longer attached (None: no such link)."""
        link = self.links.pop(remote_handle, None)
        if link is not None:
            self.connection.link_count -= 1
        return link

    def send(self, performative: Performative, payload: Buffer = b"") -> None:
        self.connection.send(self.local_channel, performative, payload)

    def flow(
        self, handle: UInt | None = None, delivery_count: UInt | None = None, link_credit: UInt | None = None
    ) -> Flow:
        """A flow with the session's window, and a link's state when given."""
        return Flow(
            next_incoming_id=UInt(self.next_incoming_id & 0xFFFFFFFF),
            incoming_window=UInt(SESSION_WINDOW),
            next_outgoing_id=UInt(self.next_outgoing_id & 0xFFFFFFFF),
            outgoing_window=UInt(SESSION_WINDOW),
            handle=handle,
            delivery_count=delivery_count,
            link_credit=link_credit,
            drain=False,
            echo=False,
        )

    def send_reply(self, node: str, message: bytes) -> None:
        link = self.reply_links.get(node)
        if link is None or link.detached:
            pending = self.pending_replies.setdefault(node, [])
            limit = self.connection.context.limits.pending_replies
            if len(pending) >= limit:
                raise ProtocolViolation(
                    "amqp:resource-limit-exceeded",
                    f"More than {limit} replies of {node} wait for a reply link to be attached.",
                )
            pending.append(message)
            return
        link.send_message(message)

    def attach_reply_link(self, node: str, link: ReplySink) -> None:
        """Replies for `node` go out on `link` from now on, those waiting for it first."""
        self.reply_links[node] = link
        for message in self.pending_replies.pop(node, []):
            link.send_message(message)

    def close_links(self) -> None:
        for link in list(self.links.values()):
            link.release()
        self.connection.link_count -= len(self.links)
        self.links.clear()
