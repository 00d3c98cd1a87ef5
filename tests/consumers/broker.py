"""The real RabbitMQ the consumer tests talk to, and a throwaway node of their own.

The suite never mocks the broker and never skips: :func:`broker_url` fails loudly when
the broker at ``IDEMPOTENCE_TEST_AMQP`` (default 127.0.0.1:5672, guest/guest) does not
answer (``.ci/run`` starts it). Queues get unique names and are deleted after the test;
the shared broker is never stopped. :class:`OwnNode` starts a RabbitMQ node of the
test's own (its own ports, data and log directories, no plugins), which a test may stop
and start again; :class:`Gate` puts a relay that a test shuts and opens in front of the
shared broker, for an outage of a few seconds without a restart.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import pika
import pika.exceptions

DEFAULT_AMQP = "amqp://guest:guest@127.0.0.1:5672/%2F"


def broker_url() -> str:
    url = os.environ.get("IDEMPOTENCE_TEST_AMQP", DEFAULT_AMQP)
    try:
        pika.BlockingConnection(pika.URLParameters(url)).close()
    except pika.exceptions.AMQPError as exc:
        raise RuntimeError(
            f"no RabbitMQ broker at {url} ({exc!r}): the consumer tests need a real one. "
            "Start it (`rabbitmq-server -detached`, as .ci/run does) or point "
            "IDEMPOTENCE_TEST_AMQP at one."
        ) from exc
    return url


def unique_queue(prefix: str = "idem-test") -> str:
    return f"{prefix}-{os.getpid()}-{uuid.uuid4().hex[:10]}"


class Broker:
    """A blocking connection for publishing and inspecting a test's queues."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.connection = pika.BlockingConnection(pika.URLParameters(url))
        self.channel = self.connection.channel()
        self.channel.confirm_delivery()

    def declare(self, queue: str) -> None:
        from idempotence.consumers._rabbitmq import Topology

        topology = Topology(queue)
        self.channel.queue_declare(queue, durable=True)
        self.channel.queue_declare(
            topology.delay_queue, durable=True, arguments=topology.delay_arguments()
        )
        self.channel.queue_declare(topology.dead_letter_queue, durable=True)

    def publish(
        self, queue: str, body: bytes, message_id: str | None = None, **headers: object
    ) -> None:
        properties = pika.BasicProperties(
            message_id=message_id,
            delivery_mode=pika.DeliveryMode.Persistent,
            headers=dict(headers) or None,
        )
        self.channel.basic_publish("", queue, body, properties, mandatory=True)

    def count(self, queue: str) -> int:
        """Ready messages in ``queue`` (unacked ones are not counted)."""
        return int(self.channel.queue_declare(queue, passive=True).method.message_count)

    def unacked(self, queue: str) -> int:
        """Messages of ``queue`` delivered and not acknowledged yet (the broker's count,
        read with ``rabbitmqctl``: AMQP does not tell it)."""
        listed = subprocess.run(
            ["rabbitmqctl", "-q", "list_queues", "name", "messages_unacknowledged"],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout  # fmt: skip
        for line in listed.splitlines():
            name, _, count = line.rpartition("\t")
            if name == queue:
                return int(count)
        raise AssertionError(f"no queue {queue!r} on the broker")

    def drain(self, queue: str) -> list[tuple[pika.BasicProperties, bytes]]:
        """Take every ready message of ``queue``."""
        taken = []
        while True:
            method, properties, body = self.channel.basic_get(queue, auto_ack=True)
            if method is None:
                return taken
            taken.append((properties, body))

    def delete(self, queue: str) -> None:
        for name in (queue, f"{queue}.delay", f"{queue}.dead"):
            self.channel.queue_delete(name)

    def close(self) -> None:
        if self.connection.is_open:
            self.connection.close()


@contextmanager
def queue_for_test(url: str) -> Iterator[tuple[Broker, str]]:
    """A declared, unique queue (with its delay and dead-letter queues), deleted after."""
    broker = Broker(url)
    queue = unique_queue()
    broker.declare(queue)
    try:
        yield broker, queue
    finally:
        try:
            if not broker.connection.is_open:
                broker = Broker(url)
            broker.delete(queue)
        finally:
            broker.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class OwnNode:
    """A RabbitMQ node of the test's own: stopped and started at will, deleted after."""

    def __init__(self) -> None:
        if shutil.which("rabbitmq-server") is None:
            raise RuntimeError("rabbitmq-server is not installed: cannot start a test node")
        self.base = Path(tempfile.mkdtemp(prefix="idem-rabbit-"))
        self.port, dist = free_port(), free_port()
        self.node = f"idem-test-{os.getpid()}-{self.port}@localhost"
        plugins = self.base / "enabled_plugins"
        plugins.write_text("[].\n")
        # The machine's rabbitmq.conf names the shared broker's listener: ours says its own.
        config = self.base / "rabbitmq.conf"
        config.write_text(f"listeners.tcp.local = 127.0.0.1:{self.port}\n")
        if os.geteuid() == 0:
            # rabbitmq-server drops to the rabbitmq user when started as root.
            for path in (self.base, plugins, config):
                shutil.chown(path, "rabbitmq", "rabbitmq")
        self.env = {
            "RABBITMQ_CONFIG_FILE": str(config),
            **os.environ,
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(dist),
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_MNESIA_BASE": str(self.base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.base / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(plugins),
            "RABBITMQ_PID_FILE": str(self.base / "node.pid"),
        }
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def start(self, timeout: float = 90.0) -> None:
        subprocess.run(["rabbitmq-server", "-detached"], env=self.env, cwd=self.base, check=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                pika.BlockingConnection(pika.URLParameters(self.url)).close()
                return
            except pika.exceptions.AMQPError:
                time.sleep(0.5)
        raise RuntimeError(f"the test's RabbitMQ node {self.node} did not start in {timeout}s")

    def stop(self) -> None:
        subprocess.run(
            ["rabbitmqctl", "-n", self.node, "stop"],
            env=self.env,
            check=False,
            capture_output=True,
            timeout=120,
        )

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)


class Gate:
    """A TCP relay in front of a broker, which a test shuts and opens: shut, nothing
    listens on its port, so a client's connection is refused as by a broker that is
    down; open, it relays every connection to the broker; shut again, it cuts the
    connections it relays, as a broker restart does. The broker behind stays real."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self._target = (parts.hostname or "127.0.0.1", parts.port or 5672)
        self.port = free_port()
        self.url = parts._replace(
            netloc=f"{parts.username}:{parts.password}@127.0.0.1:{self.port}"
        ).geturl()
        self._server: socket.socket | None = None
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    @property
    def is_open(self) -> bool:
        return self._server is not None

    def open(self) -> None:
        server = socket.create_server(("127.0.0.1", self.port))
        self._server = server
        threading.Thread(target=self._accept, args=(server,), daemon=True).start()

    def shut(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        with self._lock:
            cut, self._sockets = self._sockets, []
        for sock in cut:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self, server: socket.socket) -> None:
        while True:
            try:
                client, _ = server.accept()
            except OSError:
                return  # shut
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy ``source`` to ``sink`` until either closes."""
    with contextlib.suppress(OSError):
        while data := source.recv(65536):
            sink.sendall(data)
    for sock in (source, sink):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
