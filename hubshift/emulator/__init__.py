"""A local Event Hubs: an AMQP 1.0 server that the unmodified azure-eventhub SDK talks to.

Start it with `hubshift emulator --port 0 --hub NAME:PARTITIONS ...` (it prints its connection string) or,
from tests, benchmarks and the demo, with `hubshift.emulator.launch.start_emulator` / `running_emulator`.

Layers, bottom up (each imports only modules listed before it):

- `codec`: AMQP 1.0 types, encode/decode, typed wrappers so values round-trip with their types.
- `frames`: frames and performatives, always written with every field (pyamqp reads by index).
- `messages`: events kept as raw section bytes, service annotations stamped once at enqueue,
  batches (message format 0x80013700) unpacked, `$cbs`/`$management` requests and replies.
- `routing`: the partition-key hash the service and the SDK's buffered producer use.
- `partition_log`: one partition's retained events, sequence numbers, byte offsets, retention.
- `persistence`: `--data-dir` (SQLite, written before a delivery is accepted).
- `broker`: hubs, consumer groups, routing, owner-level (epoch) rules, retention, persistence.
- `cbs`, `management`: put-token / SAS verification, and READ of hub and partition properties.
- `connection`: one AMQP connection on asyncio (SASL, sessions, links, credit, settlement).
- `config`, `server`, `cli`: settings (flags and Microsoft's Config.json), the listener, the command.

It imports nothing else from hubshift except `hubshift.errors`.
"""
