"""Real Redis servers for the tests: the machine's shared one, and throwaway ones.

* :data:`SHARED_URL` is the machine's Redis (``IDEMPOTENCE_TEST_REDIS`` overrides it).
  Other test runs share it: a test never flushes it, and works under a key prefix of
  its own (:func:`unique_prefix`), deleted by SCAN afterwards (:func:`delete_prefix`).
  It must answer: :func:`require` fails loudly, never skips.
* :class:`RedisServer` is a ``redis-server`` of the test's own on a free port, with no
  persistence (``--save '' --appendonly no``): the one a test may stop and restart.
* :func:`redis_cluster` starts three such servers in cluster mode and joins them with
  ``redis-cli --cluster create``; all three are stopped and deleted at the end.
* :func:`replicated` starts a master and a replica of it, in sync; :func:`sentinel_group`
  adds a sentinel watching them (quorum 1), to promote the replica when the master
  dies. Everything is stopped and deleted at the end.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import redis

from tests.support.polling import eventually

SHARED_URL = os.environ.get("IDEMPOTENCE_TEST_REDIS", "redis://127.0.0.1:6379/0")


def require(url: str = SHARED_URL) -> str:
    """``url`` if its server answers a PING; a loud failure otherwise."""
    try:
        with redis.Redis.from_url(url, socket_connect_timeout=2) as client:
            client.ping()
    except redis.RedisError as exc:
        raise RuntimeError(
            f"the tests need a Redis server at {url} (set IDEMPOTENCE_TEST_REDIS): {exc}"
        ) from exc
    return url


def unique_prefix() -> str:
    return f"idemtest-{uuid.uuid4().hex[:12]}"


def delete_prefix(client: redis.Redis | redis.RedisCluster, prefix: str) -> int:
    """Delete every key under ``prefix`` (SCAN, never KEYS); how many."""
    names = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    for name in names:
        client.delete(name)
    return len(names)


def free_port() -> int:
    """A free port whose cluster bus port (+ 10000) is free too and below 65536."""
    for _ in range(1000):
        port = random.randrange(20000, 50000)
        if _free(port) and _free(port + 10000):
            return port
    raise RuntimeError("no free port pair for a test redis-server")


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class RedisServer:
    """A ``redis-server`` process of the test's own, with no persistence."""

    def __init__(self, port: int | None = None, *extra: str) -> None:
        self.port = port or free_port()
        self.extra = extra
        self.directory = Path(tempfile.mkdtemp(prefix="idemtest-redis-"))
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("the tests need redis-server on PATH")
        self.process = subprocess.Popen(
            [
                binary,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.directory),
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while True:
            try:
                with redis.Redis(
                    host="127.0.0.1", port=self.port, socket_connect_timeout=0.5
                ) as client:
                    client.ping()
                return self
            except redis.RedisError as exc:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"redis-server did not start on port {self.port}") from exc
                time.sleep(0.05)

    def freeze(self, frozen: bool = True) -> None:
        """SIGSTOP the server (it accepts connections and never answers), or resume it."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP if frozen else signal.SIGCONT)

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """The server SIGSTOPped for the block, resumed after it (even on failure)."""
        self.freeze()
        try:
            yield
        finally:
            if self.process is not None and self.process.poll() is None:
                self.freeze(False)

    def stop(self) -> None:
        """Kill the server (SIGKILL: a crash, nothing saved) and wait for it."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.directory, ignore_errors=True)


@contextlib.contextmanager
def redis_server(*extra: str) -> Iterator[RedisServer]:
    server = RedisServer(None, *extra).start()
    try:
        yield server
    finally:
        server.close()


@contextlib.contextmanager
def redis_cluster(size: int = 3) -> Iterator[list[RedisServer]]:
    """``size`` primaries in cluster mode on free ports, joined into one cluster
    covering all 16384 slots; yields them once the cluster says ``ok``."""
    servers: list[RedisServer] = []
    try:
        for _ in range(size):
            server = RedisServer(None, "--cluster-enabled", "yes", "--cluster-node-timeout", "2000")
            server.extra += ("--cluster-config-file", str(server.directory / "nodes.conf"))
            servers.append(server.start())
        nodes = [f"127.0.0.1:{server.port}" for server in servers]
        subprocess.run(
            ["redis-cli", "--cluster", "create", *nodes, "--cluster-yes"],
            check=True,
            capture_output=True,
            timeout=60,
        )
        deadline = time.monotonic() + 30
        while True:
            states = []
            for server in servers:
                with redis.Redis(host="127.0.0.1", port=server.port) as client:
                    states.append(client.execute_command("CLUSTER INFO").get("cluster_state"))
            if all(state == "ok" for state in states):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the test cluster did not come up: {states}")
            time.sleep(0.1)
        yield servers
    finally:
        for server in servers:
            server.close()


@contextlib.contextmanager
def replicated() -> Iterator[tuple[RedisServer, RedisServer]]:
    """A master and its replica, yielded once the replica is in sync (its link up
    and its offset the master's)."""
    with replicas(1) as (master, copies):
        yield master, copies[0]


#: A master starts a replica's sync at once (no diskless delay of 5 s): a replica
#: restarted, or re-pointed at a promoted master, is in sync within a second.
_NO_SYNC_DELAY = ("--repl-diskless-sync-delay", "0")


@contextlib.contextmanager
def replicas(count: int) -> Iterator[tuple[RedisServer, list[RedisServer]]]:
    """A master and ``count`` replicas of it, yielded once all are in sync."""
    master = RedisServer(None, *_NO_SYNC_DELAY)
    copies: list[RedisServer] = []
    try:
        master.start()
        for _ in range(count):
            copies.append(
                RedisServer(None, *_NO_SYNC_DELAY, "--replicaof", "127.0.0.1", str(master.port))
            )
            copies[-1].start()
        for copy in copies:
            caught_up(master, copy)
        _acknowledging(master, count)
        yield master, copies
    finally:
        for copy in copies:
            copy.close()
        master.close()


def _acknowledging(master: RedisServer, count: int) -> None:
    """Wait until ``count`` replicas acknowledge a write (``WAIT``). In sync is not
    enough: a freshly synced replica may leave a master's first WAITs unanswered for
    up to a second, which a test of WAIT itself would read as a lagging replica."""
    with redis.Redis(port=master.port, socket_timeout=1) as primary:

        def acknowledged() -> bool:
            primary.set("idemtest:acknowledged", "1")
            return bool(primary.wait(count, 50) >= count)

        eventually(acknowledged, f"{count} replica(s) acknowledge a write", timeout=15)
        primary.delete("idemtest:acknowledged")


def caught_up(master: RedisServer, replica: RedisServer, within: float = 15.0) -> None:
    """Wait until ``replica`` has everything ``master`` wrote (a loud failure after
    ``within`` seconds)."""
    deadline = time.monotonic() + within
    with (
        redis.Redis(port=master.port, socket_timeout=1) as primary,
        redis.Redis(port=replica.port, socket_timeout=1) as copy,
    ):
        while True:
            info = copy.info("replication")
            if (
                info.get("master_link_status") == "up"
                and info.get("slave_repl_offset")
                == primary.info("replication")["master_repl_offset"]
            ):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the replica never caught up: {info}")
            time.sleep(0.02)


SENTINEL_SERVICE = "idemsvc"


class SentinelGroup:
    """A master, its replicas and one sentinel (quorum 1, down after
    ``down_after_ms``)."""

    def __init__(
        self, master: RedisServer, replicas: list[RedisServer], down_after_ms: int
    ) -> None:
        self.master = master
        self.replicas = replicas
        self.port = free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="idemtest-sentinel-"))
        self.down_after_ms = down_after_ms
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def replica(self) -> RedisServer:
        """The first replica (the one of a group of one)."""
        return self.replicas[0]

    @contextlib.contextmanager
    def lagging(self) -> Iterator[None]:
        """Every replica behind for the block: SIGSTOPped, and its link cut by the
        master (``CLIENT KILL TYPE replica``), so none of the master's writes of the
        block reach it, even after it resumes if the master is gone by then. (SIGSTOP
        alone is no lag: the kernel takes the stream into the stopped replica's socket,
        and it reads it all once resumed, even from a dead master.)"""
        with contextlib.ExitStack() as stack:
            for each in self.replicas:
                stack.enter_context(each.frozen())
            with redis.Redis(port=self.master.port, socket_timeout=5) as client:
                client.client_kill_filter(_type="replica")
            yield

    @property
    def url(self) -> str:
        """The ``redis+sentinel://`` URL of the group's master, database 0."""
        return f"redis+sentinel://127.0.0.1:{self.port}/{SENTINEL_SERVICE}/0"

    def start(self) -> SentinelGroup:
        config = self.directory / "sentinel.conf"
        config.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {self.directory}\n"
            f"sentinel monitor {SENTINEL_SERVICE} 127.0.0.1 {self.master.port} 1\n"
            f"sentinel down-after-milliseconds {SENTINEL_SERVICE} {self.down_after_ms}\n"
            f"sentinel failover-timeout {SENTINEL_SERVICE} 5000\n"
        )
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("the tests need redis-server on PATH")
        self.process = subprocess.Popen(
            [binary, str(config), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 15
        while True:  # the sentinel knows the master and its replicas
            try:
                with redis.Redis(port=self.port, socket_timeout=1) as client:
                    if len(client.sentinel_slaves(SENTINEL_SERVICE)) >= len(self.replicas):
                        return self
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the sentinel never saw the replicas")
            time.sleep(0.1)

    def master_port(self) -> int | None:
        """The port of the master the sentinel names now (None if it cannot say)."""
        try:
            with redis.Redis(port=self.port, socket_timeout=1) as client:
                address = client.sentinel_get_master_addr_by_name(SENTINEL_SERVICE)
        except redis.RedisError:
            return None
        return None if not address else int(address[1])

    def wait_promoted(self, within: float = 30.0) -> float:
        """Wait until the sentinel names a replica as the master and that replica
        says so too; the seconds it took."""
        started = time.monotonic()
        ports = {replica.port for replica in self.replicas}
        while True:
            port = self.master_port()
            if port in ports:
                with (
                    contextlib.suppress(redis.RedisError),
                    redis.Redis(port=port, socket_timeout=1) as client,
                ):
                    if client.info("replication")["role"] == "master":
                        return time.monotonic() - started
            if time.monotonic() - started > within:
                raise RuntimeError(f"no replica was promoted within {within} s")
            time.sleep(0.05)

    def close(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None
        shutil.rmtree(self.directory, ignore_errors=True)


@contextlib.contextmanager
def sentinel_group(down_after_ms: int = 1000, replica_count: int = 1) -> Iterator[SentinelGroup]:
    """A master, ``replica_count`` replicas in sync and a sentinel watching them; all
    stopped and deleted at the end."""
    with replicas(replica_count) as (master, copies):
        group = SentinelGroup(master, copies, down_after_ms)
        try:
            yield group.start()
        finally:
            group.close()
