"""The emulator under abuse: garbage bytes, abrupt disconnects, half-open connections, reconnect storms,
a crash; and its command line's errors. Stored events and other connections must come through."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from azure.eventhub import EventData, parse_connection_string
from emulator_clients import BackgroundConsumer, producer, receive, wait_until

from hubshift.emulator import performatives
from hubshift.emulator.codec import Symbol
from hubshift.emulator.launch import RunningEmulator

pytestmark = pytest.mark.timeout(120)

SASL_INIT = performatives.frame_of(0, performatives.SaslInit(Symbol("ANONYMOUS"), b"", "localhost"))


def raw_socket(server: RunningEmulator) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=5)


def abuse(server: RunningEmulator) -> None:
    """Every kind of bad peer, several times over."""
    payloads = [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        os.urandom(4096),
        b"AMQP\x03\x01\x00\x00" + os.urandom(200),
        b"AMQP\x03\x01\x00\x00"
        + SASL_INIT
        + b"AMQP\x00\x01\x00\x00"
        + b"\x00\x00\x00\x10\x02\x00\x00\x00"
        + os.urandom(8),
        b"AMQP\x03\x01\x00\x00" + SASL_INIT + b"AMQP\x00\x01\x00\x00" + b"\xff\xff\xff\xff\x02\x00\x00\x00",
        b"AMQP\x03\x01\x00\x00"
        + SASL_INIT
        + b"AMQP\x00\x01\x00\x00"
        + b"\x00\x00\x00\x20\x02\x00\x00\x00"
        + b"\x00\x53\x10",
        b"AMQP\x00\x01\x00\x00" + performatives.frame_of(0, performatives.Open("c")) + os.urandom(100),
    ]
    for _ in range(3):
        for payload in payloads:
            with raw_socket(server) as sock:
                try:
                    sock.sendall(payload)
                    sock.settimeout(0.5)
                    sock.recv(4096)
                except OSError:
                    pass
    for _ in range(100):  # a reconnect storm of connections that vanish mid-handshake
        sock = raw_socket(server)
        sock.sendall(b"AMQP\x03\x01")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()  # RST


def test_garbage_and_abrupt_disconnects_lose_nothing(emulator: RunningEmulator) -> None:
    with producer(emulator.connection_string) as client:
        client.send_batch([EventData(f"before-{index}") for index in range(50)], partition_id="0")
    with BackgroundConsumer(emulator.connection_string, partition_id="1", starting_position="-1") as live:
        half_open = [raw_socket(emulator) for _ in range(20)]
        for index, sock in enumerate(half_open):
            sock.sendall(b"AMQP\x03\x01\x00\x00" + SASL_INIT[: index % len(SASL_INIT)])
        abuse(emulator)
        with producer(emulator.connection_string) as client:
            for index in range(20):
                client.send_event(EventData(f"during-{index}"), partition_id="1")
        assert wait_until(lambda: len(live.events) == 20, 20)
        assert live.errors == []
        for sock in half_open:
            sock.close()
    assert emulator.process is not None and emulator.process.poll() is None
    collector = receive(emulator.connection_string, 50, partition_id="0")
    assert collector.bodies() == [f"before-{index}".encode() for index in range(50)]
    assert "Traceback" not in emulator.log()


def test_a_producer_killed_mid_delivery_does_not_hurt_the_others(emulator: RunningEmulator) -> None:
    script = (
        "import sys, time\n"
        "from azure.eventhub import EventHubProducerClient, EventData\n"
        "client = EventHubProducerClient.from_connection_string(sys.argv[1], eventhub_name='hub')\n"
        "while True:\n"
        "    client.send_batch([EventData(b'z' * 20000) for _ in range(40)], partition_id='2')\n"
    )
    victims = [
        subprocess.Popen(
            [sys.executable, "-c", script, emulator.connection_string], stderr=subprocess.DEVNULL
        )
        for _ in range(2)
    ]
    try:
        with producer(emulator.connection_string) as client:
            assert wait_until(
                lambda: client.get_partition_properties("2")["last_enqueued_sequence_number"] > 100, 30
            )
            for victim in victims:
                victim.kill()
            client.send_event(EventData("survivor"), partition_id="3")
            stored = client.get_partition_properties("2")["last_enqueued_sequence_number"] + 1
    finally:
        for victim in victims:
            victim.kill()
            victim.wait(10)
    assert stored % 40 == 0  # whole batches only: a delivery cut mid-transfer is never half stored
    assert receive(emulator.connection_string, 1, partition_id="3").bodies() == [b"survivor"]


def test_consumer_reconnect_loops_leave_no_receivers_behind(emulator: RunningEmulator) -> None:
    for _ in range(8):
        with BackgroundConsumer(emulator.connection_string, partition_id="0", starting_position="-1"):
            time.sleep(0.3)
    # had any of those left a receiver registered, five more without owner level would be refused
    consumers = [
        BackgroundConsumer(emulator.connection_string, partition_id="0", starting_position="-1")
        for _ in range(5)
    ]
    collectors = [consumer.__enter__() for consumer in consumers]
    try:
        time.sleep(2)  # all five attached
        # a sixth without owner level is refused (the SDK retries it silently, in a reconnect loop)
        with BackgroundConsumer(
            emulator.connection_string, partition_id="0", starting_position="-1"
        ) as sixth:
            with producer(emulator.connection_string) as client:
                client.send_event(EventData("to-all-five"), partition_id="0")
            assert wait_until(lambda: all(len(collector.events) == 1 for collector in collectors), 20)
            time.sleep(2)
        assert sixth.events == []
    finally:
        for consumer in consumers:
            consumer.__exit__()


def test_events_accepted_before_a_crash_are_kept(emulator_factory: Any, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = emulator_factory(["hub:1"], data_dir=data_dir)
    with producer(server.connection_string) as client:
        for index in range(10):
            client.send_event(EventData(f"acked-{index}"))
    server.kill()
    restarted = emulator_factory(["hub:1"], data_dir=data_dir)
    assert receive(restarted.connection_string, 10).bodies() == [
        f"acked-{index}".encode() for index in range(10)
    ]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hubshift.cli", "emulator", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hub", "telemetry"], "NAME:PARTITIONS"),
        (["--hub", "telemetry:0"], "out of range"),
        (["--hub", "t:2", "--hub", "T:4"], "defined twice"),
        (["--config", "/nonexistent/Config.json"], "cannot read"),
        (["--consumer-group", "bad group"], "invalid consumer group"),
    ],
)
def test_bad_input_is_one_clear_line(args: list[str], message: str) -> None:
    result = run_cli("--port", "0", *args)
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_port_in_use_is_one_clear_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = run_cli("--port", str(taken.getsockname()[1]))
    assert result.returncode != 0
    assert "cannot listen" in result.stderr and "Traceback" not in result.stderr


def test_the_connection_string_is_printed_once_it_accepts(tmp_path: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "hubshift.cli", "emulator", "--port", "0", "--hub", "h:1", "--key", "k1"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        assert line.startswith("Endpoint=sb://127.0.0.1:")
        assert line.endswith(
            ";SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=k1;UseDevelopmentEmulator=true"
        )
        port = int(parse_connection_string(line).fully_qualified_namespace.rsplit(":", 1)[1])
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    finally:
        process.terminate()
        assert process.wait(10) == 0


def test_in_process_emulator_serves_the_sdk() -> None:
    from hubshift.emulator.launch import start_emulator

    server = start_emulator(["inproc:2"], in_process=True)
    try:
        assert server.pid == os.getpid()
        with producer(server.connection_string, hub="inproc") as client:
            client.send_event(EventData("here"), partition_id="1")
        assert receive(server.connection_string, 1, hub="inproc", partition_id="1").bodies() == [b"here"]
    finally:
        server.stop()
    threading.enumerate()  # the emulator thread is gone
    assert not any(thread.name == "hubshift-emulator" for thread in threading.enumerate())
