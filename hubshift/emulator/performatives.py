"""The AMQP 1.0 performatives (part 2 of the spec), each declared once with its field names, as the SDK's
own `_pyamqp/performatives.py` declares them: a view decoded from a frame's described list reads
`attach.source`, and a performative the server sends is built by name and written with every field
(pyamqp reads fields by index, trailing nulls included). Also the composite types they carry: source,
target and error.

Fields hold what the peer sent, unchecked: code that reads one checks its type first.
"""

from __future__ import annotations

import uuid
from typing import Any, NamedTuple

from hubshift.emulator import frames
from hubshift.emulator.codec import Buffer, DecodeError, Described, Symbol, ULong, decode_value


class Open(NamedTuple):
    container_id: Any = None
    hostname: Any = None
    max_frame_size: Any = None
    channel_max: Any = None
    idle_time_out: Any = None
    outgoing_locales: Any = None
    incoming_locales: Any = None
    offered_capabilities: Any = None
    desired_capabilities: Any = None
    properties: Any = None


class Begin(NamedTuple):
    remote_channel: Any = None
    next_outgoing_id: Any = None
    incoming_window: Any = None
    outgoing_window: Any = None
    handle_max: Any = None
    offered_capabilities: Any = None
    desired_capabilities: Any = None
    properties: Any = None


class Attach(NamedTuple):
    name: Any = None
    handle: Any = None
    role: Any = None  # True: the sender of this attach is the receiver
    snd_settle_mode: Any = None
    rcv_settle_mode: Any = None
    source: Any = None
    target: Any = None
    unsettled: Any = None
    incomplete_unsettled: Any = None
    initial_delivery_count: Any = None
    max_message_size: Any = None
    offered_capabilities: Any = None
    desired_capabilities: Any = None
    properties: Any = None


class Flow(NamedTuple):
    next_incoming_id: Any = None
    incoming_window: Any = None
    next_outgoing_id: Any = None
    outgoing_window: Any = None
    handle: Any = None
    delivery_count: Any = None
    link_credit: Any = None
    available: Any = None
    drain: Any = None
    echo: Any = None
    properties: Any = None


class Transfer(NamedTuple):
    handle: Any = None
    delivery_id: Any = None
    delivery_tag: Any = None
    message_format: Any = None
    settled: Any = None
    more: Any = None
    rcv_settle_mode: Any = None
    state: Any = None
    resume: Any = None
    aborted: Any = None
    batchable: Any = None


class Disposition(NamedTuple):
    role: Any = None
    first: Any = None
    last: Any = None
    settled: Any = None
    state: Any = None
    batchable: Any = None


class Detach(NamedTuple):
    handle: Any = None
    closed: Any = None
    error: Any = None


class End(NamedTuple):
    error: Any = None


class Close(NamedTuple):
    error: Any = None


class SaslMechanisms(NamedTuple):
    sasl_server_mechanisms: Any = None


class SaslInit(NamedTuple):
    mechanism: Any = None
    initial_response: Any = None
    hostname: Any = None


class SaslChallenge(NamedTuple):
    challenge: Any = None


class SaslResponse(NamedTuple):
    response: Any = None


class SaslOutcome(NamedTuple):
    outcome_code: Any = None  # the spec's `code`
    additional_data: Any = None


Performative = (
    Open
    | Begin
    | Attach
    | Flow
    | Transfer
    | Disposition
    | Detach
    | End
    | Close
    | SaslMechanisms
    | SaslInit
    | SaslChallenge
    | SaslResponse
    | SaslOutcome
)

_BY_CODE: dict[int, type[Performative]] = {
    frames.OPEN: Open,
    frames.BEGIN: Begin,
    frames.ATTACH: Attach,
    frames.FLOW: Flow,
    frames.TRANSFER: Transfer,
    frames.DISPOSITION: Disposition,
    frames.DETACH: Detach,
    frames.END: End,
    frames.CLOSE: Close,
    frames.SASL_MECHANISMS: SaslMechanisms,
    frames.SASL_INIT: SaslInit,
    frames.SASL_CHALLENGE: SaslChallenge,
    frames.SASL_RESPONSE: SaslResponse,
    frames.SASL_OUTCOME: SaslOutcome,
}
_CODE_OF: dict[type[Performative], int] = {kind: code for code, kind in _BY_CODE.items()}


def code_of(performative: Performative) -> int:
    """The descriptor code of a performative (0x10 open ... 0x18 close, 0x40 ... 0x44 for SASL)."""
    return _CODE_OF[type(performative)]


def parse_body(body: Buffer) -> tuple[Performative, int]:
    """The performative a frame body starts with, and where a transfer's payload starts."""
    if len(body) < 3 or body[0] != 0x00:
        raise DecodeError("frame body is not a described performative")
    descriptor, pos = decode_value(body, 1, 1)
    code = frames.descriptor_code(descriptor)
    kind = _BY_CODE.get(code) if code is not None else None
    if kind is None:
        raise DecodeError(f"unknown performative descriptor {descriptor!r}")
    fields, pos = decode_value(body, pos, 1)
    if fields is None:
        fields = []
    if not isinstance(fields, list):
        raise DecodeError(f"performative {kind.__name__} is not a list")
    if len(fields) > len(kind._fields):
        del fields[len(kind._fields) :]
    return kind(*fields), pos


def frame_of(channel: int, performative: Performative, payload: Buffer = b"") -> bytes:
    """The frame that carries `performative` (and a transfer's payload), every field written."""
    code = code_of(performative)
    frame_type = frames.FRAME_TYPE_SASL if code >= frames.SASL_MECHANISMS else frames.FRAME_TYPE_AMQP
    return frames.encode_frame(channel, code, performative, payload, frame_type)


# --- the composite types performatives carry ------------------------------------------------------------


class SourceTerminus(NamedTuple):
    """AMQP's source terminus: where a link's messages come from (a partition, a node)."""

    address: Any = None
    durable: Any = None
    expiry_policy: Any = None
    timeout: Any = None
    dynamic: Any = None
    dynamic_node_properties: Any = None
    distribution_mode: Any = None
    filter: Any = None
    default_outcome: Any = None
    outcomes: Any = None
    capabilities: Any = None

    @classmethod
    def view(cls, value: object) -> SourceTerminus | None:
        """The source an attach carries (None when it carries none, or not a described list)."""
        fields = _composite_fields(value, frames.SOURCE, len(cls._fields))
        return None if fields is None else cls(*fields)

    def encode(self) -> Described:
        return Described(ULong(frames.SOURCE), list(self))


class TargetTerminus(NamedTuple):
    """AMQP's target terminus: where a link's messages go (a hub, a partition, `$cbs`, `$management`)."""

    address: Any = None
    durable: Any = None
    expiry_policy: Any = None
    timeout: Any = None
    dynamic: Any = None
    dynamic_node_properties: Any = None
    capabilities: Any = None

    @classmethod
    def view(cls, value: object) -> TargetTerminus | None:
        """The target an attach carries (None when it carries none, or not a described list)."""
        fields = _composite_fields(value, frames.TARGET, len(cls._fields))
        return None if fields is None else cls(*fields)

    def encode(self) -> Described:
        return Described(ULong(frames.TARGET), list(self))


def _composite_fields(value: object, code: int, arity: int) -> list[Any] | None:
    if not isinstance(value, Described) or not isinstance(value.value, list):
        return None
    if frames.descriptor_code(value.descriptor) != code:
        return None
    return value.value[:arity]


def address_of(terminus: object) -> str | None:
    """The address of a source or target, whichever `terminus` is."""
    view: SourceTerminus | TargetTerminus | None = SourceTerminus.view(terminus)
    if view is None:
        view = TargetTerminus.view(terminus)
    address = view.address if view is not None else None
    if isinstance(address, bytes):
        return address.decode("utf-8", "replace")
    if isinstance(address, str):
        return address
    return None


class Error(NamedTuple):
    condition: Any = None
    description: Any = None
    info: Any = None

    def encode(self) -> Described:
        return Described(ULong(frames.ERROR), list(self))


TRACKING_ID = Symbol("com.microsoft:tracking-id")


def amqp_error(condition: str, description: str, info: dict[Any, Any] | None = None) -> Described:
    """An error with all three fields: pyamqp indexes condition, description and info unconditionally."""
    if not info:
        info = {TRACKING_ID: str(uuid.uuid4())}
    return Error(Symbol(condition), description, info).encode()


def outcome(code: int, fields: list[Any] | None = None) -> Described:
    return Described(ULong(code), fields or [])


def rejected_outcome(condition: str, description: str) -> Described:
    """The `rejected` delivery state, its one field the error."""
    return outcome(frames.REJECTED, [amqp_error(condition, description)])
