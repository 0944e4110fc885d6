"""The peer's attach, answered: the link its address names (a publisher to a hub or a partition, a consumer
of a partition in a consumer group, or a `$cbs` / `$management` request or reply link), or the service's
refusal (an attach with a null terminus, then a closing detach with the error)."""

from __future__ import annotations

from hubshift.emulator.broker import EmulatedHub, ReceiverRefused
from hubshift.emulator.cbs import LISTEN, SEND, Entity, parse_entity
from hubshift.emulator.codec import Array, UInt
from hubshift.emulator.consumer import RUNTIME_METRIC, ConsumerLink, resolve_start, selector_of
from hubshift.emulator.context import ProtocolViolation
from hubshift.emulator.links import PUBLISHER_CREDIT, IncomingDeliveries, Link
from hubshift.emulator.partition_log import PartitionLog
from hubshift.emulator.performatives import Attach, Detach, address_of, amqp_error
from hubshift.emulator.publisher import PublisherLink
from hubshift.emulator.requests import NODES, ReplyLink, RequestLink
from hubshift.emulator.session import Session

EPOCH = "com.microsoft:epoch"


def on_attach(session: Session, attach: Attach) -> None:
    """Answer the peer's attach on `session`."""
    remote_handle = attach.handle
    if not isinstance(remote_handle, int):
        raise ProtocolViolation("amqp:invalid-field", "attach without a handle")
    limits = session.connection.context.limits
    if not 0 <= remote_handle <= limits.handle_max:
        # the spec: a handle outside the range the partner advertised is a framing error
        raise ProtocolViolation(
            "amqp:connection:framing-error", f"handle {remote_handle} is past handle-max {limits.handle_max}"
        )
    peer_is_receiver = bool(attach.role)
    stale = session.pop_link(remote_handle)
    if stale is not None:
        stale.release()
        session.release_handle(stale.handle)
    try:
        if session.connection.link_count >= limits.links_per_connection:
            raise ReceiverRefused(
                "amqp:resource-limit-exceeded",
                f"The connection has {limits.links_per_connection} links attached, its limit.",
            )
        link = _create_link(session, attach, peer_is_receiver)
    except ReceiverRefused as refusal:
        _refuse(session, attach, peer_is_receiver, refusal.condition, refusal.description)
        return
    session.add_link(remote_handle, link)
    if isinstance(link, PublisherLink | ConsumerLink):
        link.address = address_of(link.target if isinstance(link, PublisherLink) else link.source) or ""
        link.entity = parse_entity(link.address)
        link.right = LISTEN if peer_is_receiver else SEND
    if isinstance(link, ConsumerLink):
        try:
            link.register()
        except ReceiverRefused as refusal:
            session.pop_link(remote_handle)
            session.release_handle(link.handle)
            _refuse(session, attach, peer_is_receiver, refusal.condition, refusal.description)
            return
    session.send(link.attach_reply(attach))
    if isinstance(link, IncomingDeliveries):
        count = attach.initial_delivery_count
        link.delivery_count = int(count) if isinstance(count, int) else 0
        link.credit = PUBLISHER_CREDIT
        link.send_flow()
    if isinstance(link, ReplyLink):
        session.attach_reply_link(link.node, link)


def _refuse(
    session: Session, attach: Attach, peer_is_receiver: bool, condition: str, description: str
) -> None:
    """The service's refusal: an attach with a null terminus, then a closing detach with the error."""
    handle = session.allocate_handle()
    reply = Attach(
        name=attach.name,
        handle=UInt(handle),
        role=not peer_is_receiver,
        snd_settle_mode=attach.snd_settle_mode,
        rcv_settle_mode=attach.rcv_settle_mode,
        source=None if peer_is_receiver else attach.source,
        target=attach.target if peer_is_receiver else None,
    )
    session.send(reply)
    session.send(Detach(handle=UInt(handle), closed=True, error=amqp_error(condition, description)))
    session.release_handle(handle)


def _create_link(session: Session, attach: Attach, peer_is_receiver: bool) -> Link:
    source, target = attach.source, attach.target
    address = address_of(source if peer_is_receiver else target)
    if address is None:
        raise ReceiverRefused("amqp:invalid-field", "The link has no address.")
    node = address.lower()
    if node in NODES:
        if peer_is_receiver:
            return ReplyLink(session, attach, node)
        return RequestLink(session, attach, node)
    context = session.connection.context
    entity = parse_entity(address)
    hub = context.broker.find_hub(entity.path[0]) if entity.path else None
    if hub is None:
        raise ReceiverRefused("amqp:not-found", f"The messaging entity '{address}' could not be found.")
    if context.authorizer.enforcing:
        _authorize(session, entity, LISTEN if peer_is_receiver else SEND, address)
    rest = entity.path[1:]
    if not peer_is_receiver:
        partition: PartitionLog | None = None
        if rest:
            if len(rest) != 2 or rest[0] != "partitions":
                raise ReceiverRefused(
                    "amqp:not-found", f"The messaging entity '{address}' could not be found."
                )
            partition = _partition(hub, rest[1])
        return PublisherLink(session, attach, hub, partition)
    if len(rest) != 4 or rest[0] != "consumergroups" or rest[2] != "partitions":
        raise ReceiverRefused("amqp:not-found", f"The messaging entity '{address}' could not be found.")
    consumer_group = rest[1]
    if not hub.has_consumer_group(consumer_group):
        raise ReceiverRefused(
            "amqp:not-found",
            f"The messaging entity '{hub.name}/ConsumerGroups/{consumer_group}' could not be found.",
        )
    log = _partition(hub, rest[3])
    return ConsumerLink(
        session,
        attach,
        hub=hub,
        consumer_group=consumer_group,
        partition=log,
        next_sequence=resolve_start(log, selector_of(source)),
        owner_level=_owner_level(attach),
        runtime_metric=_wants_runtime_metric(attach),
    )


def _authorize(session: Session, entity: Entity, right: str, address: str) -> None:
    """Refuse the link unless a token put on $cbs covers `entity` with `right`, as the service does."""
    connection = session.connection
    now_ms = connection.context.broker.now_ms()
    if connection.grants.allows(entity, right, now_ms):
        return
    if connection.grants.covers(entity, now_ms):
        raise ReceiverRefused(
            "amqp:unauthorized-access",
            f"Unauthorized access. '{right}' claim(s) are required to perform this operation. "
            f"Resource: '{address}'.",
        )
    raise ReceiverRefused(
        "amqp:unauthorized-access", f"Unauthorized access to '{address}': put a valid token on $cbs first."
    )


def _owner_level(attach: Attach) -> int | None:
    properties = attach.properties if isinstance(attach.properties, dict) else {}
    epoch = properties.get(EPOCH)
    return int(epoch) if isinstance(epoch, int) and not isinstance(epoch, bool) else None


def _wants_runtime_metric(attach: Attach) -> bool:
    desired = attach.desired_capabilities
    desired_list = desired.items if isinstance(desired, Array) else desired
    return (
        isinstance(desired_list, list | tuple) and RUNTIME_METRIC in desired_list
    ) or desired == RUNTIME_METRIC


def _partition(hub: EmulatedHub, partition_id: str) -> PartitionLog:
    log = hub.partition(partition_id)
    if log is None:
        raise ReceiverRefused(
            "com.microsoft:argument-out-of-range",
            "The specified partition is invalid for an EventHub partition sender or receiver. It "
            f"should be between 0 and {len(hub.partitions) - 1}.",
        )
    return log
