"""Test hosts on one machine: an app host in its own network namespace, and faults on
its links (DESIGN 13).

An :class:`AppHost` is a network namespace joined to this machine by two veth pairs:

* the **front** link, over which the test (the client) reaches the app server;
* the **back** link, over which the app server reaches the machine's PostgreSQL.

A fault on the back link cuts the app off from its database while the client can still
ask it what it answers; a fault on the front link cuts the client off from the app.

PostgreSQL listens on 127.0.0.1 only, so the back link ends in a userspace TCP
:class:`Relay` on the machine's side of the veth, which forwards to 127.0.0.1:5432. We
chose a relay over a throwaway cluster listening on the veth address: it serves the
machine's server (no second cluster to start per test), and it works for Redis and
RabbitMQ the same way. The relay's kernel acknowledges every TCP segment it receives,
so a fault must sit *between* the app and the relay, where TCP sees it: taking the
veth down (:meth:`Link.down`) drops every packet in both directions, silently, as a
partition does. The kernel here has neither netem nor a classifier qdisc (probed:
"Specified qdisc kind is unknown"), nor iptables/nft, so packet loss is whole-link loss
and latency is the relay's (:attr:`Relay.delay`).

Everything is named uniquely per test run (the process id and a counter), deleted by
:meth:`AppHost.close` (also after a failure), and every fault is healed by the context
manager that injects it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.support.polling import eventually

ROOT = Path(__file__).resolve().parents[2]
_counter = itertools.count(1)


class NetworkUnavailable(RuntimeError):
    """This machine cannot make test hosts: the message says what is missing."""


def ip(
    *args: str, netns: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    command = ["ip", *args] if netns is None else ["ip", "netns", "exec", netns, "ip", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=10, check=False)
    if check and result.returncode != 0:
        raise NetworkUnavailable(f"`{' '.join(command)}` failed: {result.stderr.strip()}")
    return result


def require_namespaces() -> None:
    """Raise :class:`NetworkUnavailable` unless this process can make namespaces."""
    if shutil.which("ip") is None:
        raise NetworkUnavailable("the network fault tests need the `ip` command (iproute2)")
    if os.geteuid() != 0:
        raise NetworkUnavailable(
            "the network fault tests create network namespaces and veth pairs: run them as root"
        )
    probe = f"idem-probe-{os.getpid()}"
    ip("netns", "add", probe)
    ip("netns", "del", probe)


@dataclass
class Link:
    """A veth pair: ``host_if`` on this machine, ``ns_if`` in the namespace, a /30 each."""

    host_if: str
    ns_if: str
    host_ip: str
    ns_ip: str
    netns: str

    def down(self) -> None:
        # The machine's end down: the namespace's end loses its carrier, and packets
        # either way are dropped with no error to the sender (a partition).
        ip("link", "set", self.host_if, "down")

    def up(self) -> None:
        ip("link", "set", self.host_if, "up")
        # The machine's route to the /30 comes back with the link.
        eventually(
            lambda: self.host_ip in ip("-4", "addr", "show", self.host_if).stdout,
            "the namespace's address shows",
            timeout=5.0,
        )

    @contextlib.contextmanager
    def partitioned(self) -> Iterator[None]:
        """The link is down inside the block, and up again after it, even on error."""
        self.down()
        try:
            yield
        finally:
            self.up()


class Relay:
    """A TCP relay on ``(host, port)`` to ``target``, one thread pair per connection.

    ``delay`` (seconds) holds each chunk before forwarding it: latency both ways.
    :meth:`cut` closes every connection and refuses new ones until :meth:`heal`: on
    loopback, with no namespace, a store whose server went away under it (its
    statements fail at once, where a partition makes them wait for the bound).
    """

    def __init__(self, host: str, target: tuple[str, int]) -> None:
        self.target = target
        self.delay = 0.0
        self._server = socket.create_server((host, 0))
        self._server.settimeout(0.2)
        self.address: tuple[str, int] = self._server.getsockname()[:2]
        self._closing = threading.Event()
        self._refusing = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name="relay", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self._refusing.is_set():
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while not self._closing.is_set():
                ready, _, _ = select.select([source], [], [], 0.2)
                if not ready:
                    continue
                data = source.recv(65536)
                if not data:
                    break
                if self.delay:
                    time.sleep(self.delay)
                sink.sendall(data)
        except (OSError, ValueError):
            # cut() closed the socket under us: select() sees fd -1 (ValueError).
            pass
        finally:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)

    def cut(self) -> None:
        """Close every relayed connection, and refuse new ones until :meth:`heal`."""
        self._refusing.set()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def heal(self) -> None:
        self._refusing.clear()

    @contextlib.contextmanager
    def cut_off(self) -> Iterator[None]:
        """Cut inside the block, healed after it, even on error."""
        self.cut()
        try:
            yield
        finally:
            self.heal()

    def close(self) -> None:
        self._closing.set()
        self._server.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()
        self._thread.join(timeout=5)


@dataclass
class AppHost:
    """A network namespace with a front and a back link (see the module docstring)."""

    name: str
    front: Link
    back: Link
    cache: Link | None = None
    """A third link, for a cache reached apart from the database (``create(cache=True)``)."""
    relays: list[Relay] = field(default_factory=list)
    servers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @classmethod
    def create(cls, *, cache: bool = False) -> AppHost:
        require_namespaces()
        n = next(_counter)
        tag = f"{os.getpid() % 100000}x{n}"  # interface names: 15 characters at most
        name = f"idem-{tag}"
        # A /30 per link in 10.x.y.z, spread by process id and counter so that
        # parallel runs pick different subnets (and we check the subnet is free).
        base = (os.getpid() * 7 + n * 3) % 16000
        links: list[Link] = []
        ip("netns", "add", name)
        try:
            ip("link", "set", "lo", "up", netns=name)
            for i, role in enumerate(("f", "b", "c") if cache else ("f", "b")):
                block = base + i
                # A /30: .1 on this machine's end, .2 in the namespace.
                net = f"10.{200 + block // 4000}.{(block % 4000) // 64}"
                last = (block % 64) * 4
                host_ip, ns_ip = f"{net}.{last + 1}", f"{net}.{last + 2}"
                host_if, ns_if = f"ih{role}{tag}", f"in{role}{tag}"
                ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
                links.append(Link(host_if, ns_if, host_ip, ns_ip, name))
                ip("link", "set", ns_if, "netns", name)
                ip("addr", "add", f"{host_ip}/30", "dev", host_if)
                ip("link", "set", host_if, "up")
                ip("addr", "add", f"{ns_ip}/30", "dev", ns_if, netns=name)
                ip("link", "set", ns_if, "up", netns=name)
        except BaseException:
            for link in links:
                ip("link", "del", link.host_if, check=False)
            ip("netns", "del", name, check=False)
            raise
        front, back, *rest = links
        return cls(name, front, back, rest[0] if rest else None)

    def exec_prefix(self) -> list[str]:
        """The command prefix that runs a command in the namespace."""
        return ["ip", "netns", "exec", self.name]

    def relay(self, target: tuple[str, int], link: Link | None = None) -> Relay:
        """A relay on ``link``'s machine end (the back link's by default) to ``target``
        (on this machine)."""
        relay = Relay((link or self.back).host_ip, target)
        self.relays.append(relay)
        return relay

    @contextlib.contextmanager
    def database(self) -> Iterator[tuple[str, str]]:
        """A throwaway PostgreSQL cluster listening on the back link's machine end
        (and on 127.0.0.1), trusting the namespace's address: the app reaches it with
        no relay in between, so the server's own side of each connection meets the
        partition as across a real network (its keepalives go unanswered, its
        unacknowledged data times out). Yields the URL the app uses over the back
        link and the URL of the same database on 127.0.0.1 (for the test itself)."""
        from tests.support.postgres import BASE_DIR_PREFIX, _Cluster, _server_user, find_bindir

        cluster = _Cluster(
            Path(tempfile.mkdtemp(prefix=BASE_DIR_PREFIX)), find_bindir(), _server_user()
        )
        try:
            cluster.prepare(allow_copy=False)
            cluster.init({"fsync": "off", "listen_addresses": f"127.0.0.1,{self.back.host_ip}"})
            with (cluster.data / "pg_hba.conf").open("a") as hba:
                hba.write(f"host all all {self.back.ns_ip}/32 trust\n")
            port = cluster.start()
            local = f"postgresql://postgres@127.0.0.1:{port}/postgres"
            cluster.wait_until_ready(local)
            yield f"postgresql://postgres@{self.back.host_ip}:{port}/postgres", local
        finally:
            cluster.stop()
            shutil.rmtree(cluster.base, ignore_errors=True)

    def serve(
        self, app: str, env: Mapping[str, str], port: int = 8000, timeout: float = 20.0
    ) -> str:
        """Run ``uvicorn app`` in the namespace on the front link; its base URL."""
        server, url = run_server(
            app, env, self.front.ns_ip, port, self.exec_prefix(), timeout, f" in {self.name}"
        )
        self.servers.append(server)
        return url

    def close(self) -> None:
        for server in self.servers:
            stop(server)
        for relay in self.relays:
            relay.close()
        for link in (self.front, self.back, self.cache):
            if link is None:
                continue
            # Deleting one end of a veth deletes both.
            ip("link", "del", link.host_if, check=False)
        ip("netns", "del", self.name, check=False)


def run_server(
    app: str,
    env: Mapping[str, str],
    host: str,
    port: int,
    prefix: list[str] | None = None,
    timeout: float = 20.0,
    where: str = "",
) -> tuple[subprocess.Popen[Any], str]:
    """Run ``uvicorn app`` on ``host:port`` (behind ``prefix``: in a namespace), and
    wait until it answers; the process and its base URL."""
    command = [
        *(prefix or []),
        sys.executable, "-m", "uvicorn", app,
        "--host", host, "--port", str(port),
        "--log-level", "warning", "--no-access-log",
    ]  # fmt: skip
    server = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    url = f"http://{host}:{port}"

    def ready() -> bool:
        if server.poll() is not None:
            raise RuntimeError(f"the app server{where} exited with {server.returncode}")
        try:
            httpx.get(f"{url}/health", timeout=0.5)
        except httpx.HTTPError:
            return False
        return True

    try:
        eventually(ready, f"the app server{where} answers", timeout=timeout)
    except BaseException:
        stop(server)
        raise
    return server, url


def stop(process: subprocess.Popen[Any], grace: float = 5.0) -> None:
    """SIGTERM ``process``, and SIGKILL it if it has not exited within ``grace`` s."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)
