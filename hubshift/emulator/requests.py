"""Request and reply links of the `$cbs` and `$management` nodes: a request (put-token, or READ of the hub's
or a partition's properties) is settled, answered, and the reply sent on the session's link from that node
(held until the peer attaches it)."""

from __future__ import annotations

import logging
import struct
from typing import Any

from hubshift.emulator.cbs import token_scope
from hubshift.emulator.codec import Buffer, DecodeError, UInt
from hubshift.emulator.links import IncomingDeliveries, OutgoingLink
from hubshift.emulator.management import handle_management_request
from hubshift.emulator.messages import RequestMessage, encode_reply, parse_request
from hubshift.emulator.performatives import Attach, Transfer, rejected_outcome
from hubshift.emulator.session import Session
from hubshift.emulator.wire import Wire

LOG = logging.getLogger(__name__)

CBS_NODE = "$cbs"
MANAGEMENT_NODE = "$management"
NODES = (CBS_NODE, MANAGEMENT_NODE)

_I = struct.Struct(">I")


class RequestLink(IncomingDeliveries):
    """Requests to `$cbs` or `$management`; replies go out on the same session's link from that node."""

    def __init__(self, session: Session, attach: Attach, node: str) -> None:
        super().__init__(session, attach)
        self.node = node

    def max_delivery_size(self) -> int:
        return self.connection.context.limits.max_request_size

    def on_message(self, message_format: int, payload: Buffer) -> None:
        try:
            request = parse_request(payload)
        except DecodeError as exc:
            self.settle(rejected_outcome("amqp:decode-error", f"The request could not be decoded: {exc}"))
            return
        self.settle(None)
        status, description, body = answer(self.connection, self.node, request)
        self.session.send_reply(self.node, encode_reply(request.message_id, status, description, body))


class ReplyLink(OutgoingLink):
    def __init__(self, session: Session, attach: Attach, node: str) -> None:
        super().__init__(session, attach)
        self.node = node

    def send_message(self, message: bytes) -> None:
        delivery_id = self.next_delivery_id()
        self.session.next_outgoing_id += 1
        self.delivery_count += 1
        self.credit -= 1
        self.session.send(
            Transfer(
                handle=UInt(self.handle),
                delivery_id=UInt(delivery_id),
                delivery_tag=_I.pack(delivery_id),
                message_format=UInt(0),
                settled=True,
                more=False,
            ),
            message,
        )


def answer(connection: Wire, node: str, request: RequestMessage) -> tuple[int, str, Any]:
    """The status code, description and body of the reply to `request` on `node`."""
    context = connection.context
    if node == MANAGEMENT_NODE:
        reply = handle_management_request(
            request, context.broker, context.authorizer, connection.hostname or "localhost"
        )
        return reply.status_code, reply.description, reply.body
    return put_token(connection, request)


def put_token(connection: Wire, request: RequestMessage) -> tuple[int, str, Any]:
    """A `$cbs` put-token: the token verified for the scope it names, then held by the connection for that
    scope with the rights the token carries."""
    context = connection.context
    properties = request.application_properties
    if properties.get("operation") != "put-token":
        return 400, f"The operation '{properties.get('operation')}' is not supported on $cbs.", None
    audience = properties.get("name")
    if not isinstance(audience, str):
        return 400, "The put-token request has no audience 'name'.", None
    try:
        scope = token_scope(audience, connection.hostname)
    except ValueError as exc:
        return 400, f"InvalidAudience: {exc}.", None
    if connection.hostname is None:
        connection.hostname = scope.host  # the peer's open named no host: its first token names it
    if scope.path:
        hub = context.broker.find_hub(scope.path[0])
        rest = scope.path[1:]
        group_missing = (
            hub is not None and rest[:1] == ("consumergroups",) and not hub.has_consumer_group(rest[1])
        )
        if hub is None or group_missing:
            return 404, f"The messaging entity '{audience}' could not be found.", None
    now_ms = context.broker.now_ms()
    if connection.grants.full(scope, now_ms):
        return 403, f"QuotaExceeded: this connection holds {connection.grants.limit} tokens already.", None
    verdict = context.authorizer.verify(request.body, audience, properties.get("type"))
    if verdict.accepted:
        if connection.grants.put(scope, verdict.expires_at_ms, verdict.rights, now_ms):
            LOG.info("connection %s: token for %s renewed", connection.peer, audience)
        connection.grants_changed(verdict.expires_at_ms)
    else:
        LOG.info("connection %s: token for %s refused: %s", connection.peer, audience, verdict.description)
    return verdict.status_code, verdict.description, None
