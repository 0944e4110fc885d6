"""AMQP links as the peer attaches them: the base link (attach reply, flow, detach), the links on which the
peer sends us deliveries (reassembled across transfer frames, settled), and those on which we send."""

from __future__ import annotations

import struct
import uuid

from hubshift.emulator.cbs import Entity
from hubshift.emulator.codec import Buffer, Described, UByte, UInt, ULong
from hubshift.emulator.context import ProtocolViolation
from hubshift.emulator.performatives import (
    TRACKING_ID,
    Attach,
    Detach,
    Disposition,
    Flow,
    Transfer,
    rejected_outcome,
)
from hubshift.emulator.session import Session

PUBLISHER_CREDIT = 1000

# accepted, settled disposition from the receiver side for one delivery id
_ACCEPTED_DISPOSITION = struct.Struct(">IBBH3sBBBBBIBIB3s2s")


class Link:
    """A link as attached by the peer; `role_is_receiver` is OUR role on it."""

    role_is_receiver: bool = False

    def __init__(self, session: Session, attach: Attach) -> None:
        self.session = session
        self.connection = session.connection
        self.name = attach.name
        self.remote_handle = int(attach.handle)
        self.handle = session.allocate_handle()
        self.source = attach.source
        self.target = attach.target
        self.detached = False
        self.delivery_count = 0
        self.credit = 0
        # the entity an event link reads or writes (its address, the right it needs), whose token must
        # stay valid while it is attached
        self.entity: Entity | None = None
        self.address = ""
        self.right = ""

    def attach_reply(self, peer: Attach) -> Attach:
        """Our attach in answer to the peer's."""
        return Attach(
            name=self.name,
            handle=UInt(self.handle),
            role=self.role_is_receiver,
            snd_settle_mode=peer.snd_settle_mode if peer.snd_settle_mode is not None else UByte(2),
            rcv_settle_mode=UByte(0),
            source=self.source,
            target=self.target,
            initial_delivery_count=None if self.role_is_receiver else UInt(self.delivery_count),
            max_message_size=ULong(self.connection.context.limits.max_message_size),
            properties={TRACKING_ID: str(uuid.uuid4())},
        )

    def on_flow(self, flow: Flow) -> None:
        if flow.echo:
            self.send_flow()

    def send_flow(self) -> None:
        self.session.send(
            self.session.flow(
                handle=UInt(self.handle),
                delivery_count=UInt(self.delivery_count & 0xFFFFFFFF),
                link_credit=UInt(max(self.credit, 0)),
            )
        )

    def on_transfer(self, transfer: Transfer, payload: memoryview) -> None:
        raise ProtocolViolation("amqp:not-allowed", "transfer on a link where the emulator is the sender")

    def detach(self, error: Described | None) -> None:
        """Detach and close from our side (the peer answers with its own detach)."""
        if self.detached:
            return
        self.detached = True
        self.session.send(Detach(handle=UInt(self.handle), closed=True, error=error))
        self.release()

    def on_peer_detach(self, closed: bool) -> None:
        if not self.detached:
            self.detached = True
            self.session.send(Detach(handle=UInt(self.handle), closed=bool(closed)))
        self.release()
        self.session.release_handle(self.handle)

    def release(self) -> None:
        """Give back what the link holds outside the connection (receivers, listeners)."""


class IncomingDeliveries(Link):
    """A link on which the peer sends messages to us, reassembled across transfer frames.

    A delivery in one frame is handled straight from the receive buffer. One that spans frames is copied
    as it comes (never kept as views of the receive buffers, which would hold them all), counted against
    the connection's budget of unfinished bytes, and no more of it kept once it passes the size limit (it
    is then rejected, as the service rejects an oversize message, and the link carries on)."""

    role_is_receiver = True

    def __init__(self, session: Session, attach: Attach) -> None:
        super().__init__(session, attach)
        self._receiving = False
        self._body = bytearray()
        self._size = 0
        self._delivery_id = 0
        self._message_format = 0
        self._settled = False

    def max_delivery_size(self) -> int:
        return self.connection.context.limits.max_message_size

    def on_transfer(self, transfer: Transfer, payload: memoryview) -> None:
        if not self._receiving:
            if not isinstance(transfer.delivery_id, int):
                raise ProtocolViolation(
                    "amqp:session:invalid-field", "first transfer of a delivery has no id"
                )
            self._receiving = True
            self._size = 0
            self._delivery_id = int(transfer.delivery_id) & 0xFFFFFFFF
            self._message_format = (
                int(transfer.message_format) if isinstance(transfer.message_format, int) else 0
            )
            self._settled = bool(transfer.settled)
        if transfer.settled:
            self._settled = True
        if transfer.aborted:  # nothing to settle
            self._receiving = False
            self._drop_body()
            return
        max_size = self.max_delivery_size()
        self._size += len(payload)
        if transfer.more:
            if self._size <= max_size:
                self.connection.hold(len(payload))
                self._body += payload
            elif self._body:
                self._drop_body()  # it will be rejected: none of it is kept
            return
        self._receiving = False
        self.delivery_count += 1
        self.credit -= 1
        if self._size > max_size:
            self._drop_body()
            self.settle(
                rejected_outcome(
                    "amqp:link:message-size-exceeded",
                    f"The received message (delivery-id:{self._delivery_id}, size:{self._size} bytes) "
                    f"exceeds the limit ({max_size} bytes) currently allowed on the link.",
                )
            )
        elif self._body:
            body = self._body
            body += payload
            self._body = bytearray()
            self.connection.unhold(len(body) - len(payload))
            self.on_message(self._message_format, body)
        else:
            self.on_message(self._message_format, payload)
        if self.credit < PUBLISHER_CREDIT // 2:
            self.credit = PUBLISHER_CREDIT
            self.send_flow()

    def _drop_body(self) -> None:
        self.connection.unhold(len(self._body))
        self._body = bytearray()

    def release(self) -> None:
        self._receiving = False
        self._drop_body()

    def on_message(self, message_format: int, payload: Buffer) -> None:
        raise NotImplementedError

    def settle(self, state: Described | None) -> None:
        """Settle the current delivery (unless the peer sent it settled); `None`: accepted."""
        if self._settled:
            return
        if state is None:
            self.connection.write(
                _ACCEPTED_DISPOSITION.pack(
                    31,
                    2,
                    0,
                    self.session.local_channel,
                    b"\x00\x53\x15",
                    0xC0,
                    18,
                    6,
                    0x41,
                    0x70,
                    self._delivery_id,
                    0x70,
                    self._delivery_id,
                    0x41,
                    b"\x00\x53\x24",
                    b"\x45\x40",
                )
            )
            return
        delivery_id = UInt(self._delivery_id)
        self.session.send(
            Disposition(role=True, first=delivery_id, last=delivery_id, settled=True, state=state)
        )


class OutgoingLink(Link):
    """A link on which we send: replies, or events to a consumer."""

    def on_flow(self, flow: Flow) -> None:
        if flow.link_credit is not None:
            peer_count = int(flow.delivery_count) if flow.delivery_count is not None else 0
            self.credit = peer_count + int(flow.link_credit) - self.delivery_count
        super().on_flow(flow)

    def next_delivery_id(self) -> int:
        session = self.session
        delivery_id = session.next_delivery_id
        session.next_delivery_id = (delivery_id + 1) & 0xFFFFFFFF
        return delivery_id
