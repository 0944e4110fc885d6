"""A local Event Hubs: an AMQP 1.0 server that the unmodified azure-eventhub SDK talks to.

Start it with `hubshift emulator --port 0 --hub NAME:PARTITIONS ...` (it prints its connection string) or,
from tests, benchmarks and the demo, with `hubshift.emulator.launch.start_emulator` / `running_emulator`.

Layers, bottom up (each imports only modules listed before it; `.importlinter` enforces the order):

- `codec`: AMQP 1.0 types, encode/decode (every count, size and nesting depth bounded), typed wrappers so
  values round-trip with their types.
- `frames`: protocol headers, the frame header, descriptor codes.
- `performatives`: every performative (and source, target, error) declared once with its field names:
  views decoded from a frame, builders for what the server sends (always every field: pyamqp reads by
  index), as the SDK's `_pyamqp` package lays them out.
- `messages`: events kept as raw section bytes, service annotations stamped once at enqueue,
  batches (message format 0x80013700) unpacked, `$cbs`/`$management` requests and replies.
- `routing`: the partition-key hash the service and the SDK's buffered producer use.
- `cbs`: put-token / SAS verification, the grants a connection holds.
- `partition_log`: one partition's retained events, sequence numbers, byte offsets, retention.
- `persistence`: `--data-dir` (SQLite, written before a delivery is accepted).
- `broker`: hubs, consumer groups, routing, owner-level (epoch) rules, retention, persistence.
- `management`: READ of hub and partition properties.
- `context`: what every connection of a server shares (the broker, the authorizer, the limits).
- `wire`: one connection as its sessions and links see it (frames out, the peer's limits, grants).
- `session`: begin/end, handles, delivery ids, the flow window.
- `links`: the base link, incoming deliveries (reassembly, settlement), outgoing links.
- `publisher`, `consumer`, `requests`: one module per link role (events in, events out, `$cbs` and
  `$management` request/reply).
- `attach`: the peer's attach answered with the link its address names, or the service's refusal.
- `connection`: one AMQP connection on asyncio (headers, SASL, open/close, heartbeat, frame dispatch,
  token expiry).
- `websocket`: AMQP over WebSockets on the same port (a connection's first bytes decide; aiohttp upgrades
  `/$servicebus/websocket`, subprotocol `AMQPWSB10`, its binary messages carrying the AMQP bytes).
- `config`, `tokens`, `server`, `cli`, `launch`: settings (flags and Microsoft's Config.json), Entra ID
  tokens, the listener, the command, and the one way tests start it.

It imports nothing else from hubshift except `hubshift.errors`.
"""
