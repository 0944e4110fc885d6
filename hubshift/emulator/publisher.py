"""The producer's side: a link on which the SDK sends events to a hub (routed by partition key or round
robin) or to one partition; each delivery is stored, then settled `accepted`, or `rejected` with why."""

from __future__ import annotations

import logging

from hubshift.emulator.broker import EmulatedHub
from hubshift.emulator.codec import Buffer, DecodeError
from hubshift.emulator.links import IncomingDeliveries
from hubshift.emulator.messages import unpack_publication
from hubshift.emulator.partition_log import PartitionLog
from hubshift.emulator.performatives import Attach, rejected_outcome
from hubshift.emulator.session import Session

LOG = logging.getLogger(__name__)


class PublisherLink(IncomingDeliveries):
    """Events from a producer, to the hub (routed) or to one partition."""

    def __init__(
        self, session: Session, attach: Attach, hub: EmulatedHub, partition: PartitionLog | None
    ) -> None:
        super().__init__(session, attach)
        self.hub = hub
        self.partition = partition

    def on_message(self, message_format: int, payload: Buffer) -> None:
        try:
            publication = unpack_publication(message_format, payload)
        except DecodeError as exc:
            self.settle(rejected_outcome("amqp:decode-error", f"The message could not be decoded: {exc}"))
            return
        try:
            self.connection.context.broker.publish(self.hub, self.partition, publication)
        except Exception as exc:
            LOG.exception("storing a delivery failed")
            self.settle(rejected_outcome("amqp:internal-error", f"The event could not be stored: {exc}"))
            return
        self.settle(None)
