"""One AMQP session (begin ... end) on a connection: its channel numbers, the links attached on it by the
peer's handle and the handles it gives them, delivery ids, the flow window, and the replies of `$cbs` and
`$management` routed to the session's reply link for that node."""

from __future__ import annotations

from typing import Protocol

from hubshift.emulator.cbs import Entity
from hubshift.emulator.codec import Buffer, Described, UInt
from hubshift.emulator.performatives import Flow, Performative, Transfer
from hubshift.emulator.wire import Wire

SESSION_WINDOW = 2**31 - 1


class SessionLink(Protocol):
    """A link as its session and connection handle it (`links.Link`)."""

    handle: int
    detached: bool
    # the entity an event link reads or writes, and its address (None, "": a $cbs or $management link)
    entity: Entity | None
    address: str

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
        self.links: dict[int, SessionLink] = {}
        self._local_handles: set[int] = set()
        self.next_delivery_id = 0
        self.next_outgoing_id = 0
        self.next_incoming_id = 0
        self.reply_links: dict[str, ReplySink] = {}
        self.pending_replies: dict[str, list[bytes]] = {}

    def allocate_handle(self) -> int:
        handle = 0
        while handle in self._local_handles:
            handle += 1
        self._local_handles.add(handle)
        return handle

    def release_handle(self, handle: int) -> None:
        self._local_handles.discard(handle)

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
            self.pending_replies.setdefault(node, []).append(message)
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
        self.links.clear()
