"""What the sync and the async Redis store share: the scripts, the key names, the
record's encoding and the translation of redis-py's errors (DESIGN 8).

No I/O here. The scripts live in ``redis.lua`` beside this module; the store itself is
written once in `_store_async` (`_store` is generated from it).
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from importlib import resources
from os import urandom
from typing import Any, NoReturn

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.asyncio.sentinel
import redis.backoff
import redis.cluster
import redis.exceptions
import redis.retry
import redis.sentinel

from ... import _queries
from ..._frozen import quick_new
from ...errors import ConfigurationError, StoreError, StoreMisconfigured, StoreUnavailable
from ...states import (
    STARTED,
    Claim,
    ClaimRequest,
    KeyRecord,
    KeyStatus,
    StoredResponse,
    claim_from,
    new_response,
)
from ._headers import read as read_headers
from ._headers import write as write_headers

AsyncRedis = redis.asyncio.Redis
"""The clients, in both spellings (``scripts/unasync.py`` turns ``AsyncRedis`` into
``Redis``): a plain server, or a Redis Cluster."""
Redis = redis.Redis
AsyncRedisCluster = redis.asyncio.cluster.RedisCluster
RedisCluster = redis.cluster.RedisCluster
Sentinel = redis.sentinel.Sentinel
AsyncSentinel = redis.asyncio.sentinel.Sentinel

RedisError = redis.exceptions.RedisError
"""Any error of redis-py's."""
NoScriptError = redis.exceptions.NoScriptError
"""The server does not hold a script (restarted, or ``SCRIPT FLUSH``): load it again."""

DEFAULT_TIMEOUT = 1.0
"""Connect and read timeouts of a store that opens its own client, in seconds: a Redis
that does not answer is a 503 quickly (P11), not a request hanging on a socket."""

DEFAULT_PREFIX = "idempotence"
"""What every Redis key of the store starts with (``RedisStore(prefix=)``)."""

_DOWN = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.BusyLoadingError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.MasterDownError,
    # Not a RedisError: a cluster client that reaches no node, or finds its slots
    # uncovered or the node not in cluster mode, raises it while it discovers the
    # cluster (a 503 that names the reason, never a 500).
    redis.exceptions.RedisClusterException,
)
"""Redis errors that mean "not now": the server is unreachable, loading, read-only
after a failover, or the cluster is reconfiguring. The store answers them with
StoreUnavailable (503 + Retry-After); any other Redis error is a StoreError."""

_TEXT = "surrogatepass"  # any Python str survives the trip, even a lone surrogate


def _scripts() -> dict[str, str]:
    text = resources.files("idempotence").joinpath("stores", "redis", "redis.lua").read_text()
    parsed = _queries.parse(text)
    prelude = parsed.pop("prelude")
    return {name: prelude + "\n" + body for name, body in parsed.items()}


SCRIPTS = _scripts()
"""The scripts by name, each with the prelude in front (``redis.lua``)."""


def check_prefix(prefix: str) -> str:
    """Refuse a prefix that would move the hash tag (a brace) or is empty."""
    if not prefix or "{" in prefix or "}" in prefix:
        raise ConfigurationError(
            f"invalid Redis key prefix {prefix!r}: use a non-empty name without braces"
        )
    return prefix


def encode(text: str) -> bytes:
    return text.encode("utf-8", _TEXT)


def decode(raw: bytes) -> str:
    return raw.decode("utf-8", _TEXT)


def record_key(prefix: str, scope: str, key: str) -> bytes:
    """The Redis key of one record: the scope and the key are both in it (no global
    namespace), length-prefixed so no two (scope, key) pairs share a name, behind a
    hash tag that is the digest of both: the tag holds no brace whatever the key
    holds, so the record stays in one cluster slot and records spread over all.

    ```python
    record_key("idem", "acct_1", "k{1}")
    # b'idem:{57f36082ffaff2a771c98954}:6:acct_1:k{1}'
    ```
    """
    return encoded_record_key(encode(prefix), scope, key)


def encoded_record_key(prefix: bytes, scope: str, key: str) -> bytes:
    """`record_key` of a prefix already encoded (a store's, once)."""
    return _record_key(prefix, encode(scope), encode(key))


def _record_key(prefix: bytes, s: bytes, k: bytes) -> bytes:
    tag = hashlib.blake2b(b"%d:%s:%s" % (len(s), s, k), digest_size=12).hexdigest()
    return b"%s:{%s}:%d:%s:%s" % (prefix, tag.encode(), len(s), s, k)


def record_pattern(prefix: str, scope: str | None) -> bytes:
    """The SCAN pattern of the records of ``scope`` (every scope when None)."""
    if scope is None:
        return _glob(encode(prefix)) + b":{*}:*"
    s = encode(scope)
    return b"%s:{*}:%d:%s:*" % (_glob(encode(prefix)), len(s), _glob(s))


def _glob(raw: bytes) -> bytes:
    out = bytearray()
    for byte in raw:
        if byte in b"*?[]\\":
            out += b"\\"
        out.append(byte)
    return bytes(out)


def channel(prefix: str) -> bytes:
    """The pub/sub channel on which the settle scripts wake waiting twins (P10)."""
    return encode(prefix) + b":settled"


def claim_call(
    prefix: bytes, request: ClaimRequest, replicated: bool = False
) -> tuple[bytes, list[bytes], int]:
    """The claim script's key (`encoded_record_key`) and ARGV, and the id of the
    record it writes for a new key; ``replicated`` when the store waits for replicas
    (a replay then writes, so that its WAIT covers the finish it read: `_replicas`)."""
    try:
        # Strict UTF-8 writes what surrogatepass writes for every text it takes, for
        # less; only a lone surrogate needs the slower spelling.
        s, k, fingerprint, method, path, flow = (
            request.scope.encode(),
            request.key.encode(),
            request.fingerprint.encode(),
            request.method.encode(),
            request.path.encode(),
            request.flow.encode(),
        )
    except UnicodeEncodeError:
        s, k, fingerprint, method, path, flow = (
            encode(request.scope),
            encode(request.key),
            encode(request.fingerprint),
            encode(request.method),
            encode(request.path),
            encode(request.flow),
        )
    # The record's id: random, so a lease names one incarnation of the key (F1);
    # secrets.randbits(62)'s own spelling, without its call.
    record_id = (int.from_bytes(urandom(8)) >> 2) + 1
    retention = request.retention
    # Bytes only, so that the lane packs them itself (`_resp`), not through hiredis.
    args = [
        s,
        k,
        fingerprint,
        method,
        path,
        flow,
        _json_params(request.params),
        _us_bytes(request.lock_timeout),
        b"" if retention is None else _us_bytes(retention),
        b"%d" % record_id,
        b"1" if replicated else b"0",
    ]
    return _record_key(prefix, s, k), args, record_id


def finish_args(response: StoredResponse, error: str | None, settled_channel: bytes) -> list[bytes]:
    return [
        decimal(response.status),
        write_headers(response.headers),
        response.body,
        b"0" if error is None else b"1",
        b"" if error is None else encode(error),
        settled_channel,
    ]


def decimal(number: int) -> bytes:
    """``number`` as a script reads it (an integer in decimal), as bytes."""
    return _DECIMALS[number] if 0 <= number < 1000 else b"%d" % number


_DECIMALS = [b"%d" % n for n in range(1000)]
"""Small integers (statuses, fencing tokens) in decimal, looked up, not formatted."""
_INTEGERS = {raw: n for n, raw in enumerate(_DECIMALS)}
_DURATIONS: dict[bytes, timedelta] = {}


def _integer(raw: bytes) -> int:
    """``int(raw)``, a small one (a status, a fencing token) looked up, not parsed."""
    found = _INTEGERS.get(raw)
    return int(raw) if found is None else found


def _duration(raw: bytes) -> timedelta:
    """A lock timeout as stored (whole microseconds): an endpoint's own, so the few
    there are are kept, as `_us_bytes` keeps them the other way."""
    found = _DURATIONS.get(raw)
    if found is None:
        found = int(raw) * MICROSECOND
        if len(_DURATIONS) < 256:
            _DURATIONS[raw] = found
    return found


_US_BYTES: dict[timedelta, bytes] = {}


def _json_params(params: Any) -> bytes:
    # Most claims have no parameters (every handler endpoint's): no encoder call.
    if type(params) is dict and not params:
        return b"{}"
    return json.dumps(params, separators=(",", ":")).encode()


MICROSECOND = timedelta(microseconds=1)
"""Times are stored as integer microseconds since the Unix epoch (here and in the
cached store's entries)."""
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _load_params(raw: bytes | str) -> Any:
    # A new dict each time: the record's params are the caller's to change.
    return {} if raw == b"{}" or raw == "{}" else json.loads(raw)


def _us(value: timedelta) -> int:
    return value // MICROSECOND


def _us_bytes(value: timedelta) -> bytes:
    """`_us` in decimal, for a claim's lock timeout and retention: an endpoint's own,
    so the few there are are kept."""
    found = _US_BYTES.get(value)
    if found is None:
        found = b"%d" % _us(value)
        if len(_US_BYTES) < 256:
            _US_BYTES[value] = found
    return found


def timestamp(raw: bytes | int | str) -> datetime:
    """A time as the scripts store it (microseconds since the epoch, server clock)."""
    return EPOCH + int(raw) * MICROSECOND


READ_FIELDS = (
    b"id", b"scope", b"key", b"method", b"path", b"fp", b"params", b"flow",
    b"rp", b"token", b"locked", b"lto", b"created", b"last_run", b"finished", b"expires",
    b"status", b"headers", b"body", b"error", b"calling",
)  # fmt: skip
"""The fields a claim script reads back, in the order of ``READ_FIELDS`` in
``redis.lua``, packed into one string (`unpack`)."""


_LENGTHS = struct.Struct(f">{len(READ_FIELDS)}i")
"""The lengths in front of the values (see `unpack`)."""


def unpack(packed: bytes) -> dict[bytes, bytes]:
    """A hash's fields from the one string that a script's ``read`` returns: the
    length of each of ``READ_FIELDS``' values (4 bytes, big-endian, -1 when absent),
    then the values present, one after the other. The lengths are read in one call,
    not parsed one by one: every replay reads a record.

    ```python
    absent = (-1,) * (len(READ_FIELDS) - 2)
    unpack(_LENGTHS.pack(1, *absent, 2) + b"7{}")[b"calling"]
    # b'{}'
    ```
    """
    return _unpack(packed)


def _not_read_fields(packed: bytes) -> StoreError:
    return StoreError(f"the Redis claim script's reply is not READ_FIELDS: {packed[:80]!r}")


def _unpacker() -> Callable[[bytes], dict[bytes, bytes]]:
    """`unpack`'s work written out field by field, without a loop (as `_resp` writes
    its packers): a loop over the 21 fields cost a replay a fifth more."""
    lengths = [f"l{i}" for i in range(len(READ_FIELDS))]
    lines = [
        "def unpack(packed):",
        "  try:",
        f"    {', '.join(lengths)}, = _lengths(packed)",
        "  except _error:",
        "    raise _refused(packed) from None",
        "  fields = {}",
        f"  at = {_LENGTHS.size}",
    ]
    for name, length in zip(READ_FIELDS, lengths, strict=True):
        lines += [
            f"  if {length} >= 0:",
            f"    fields[{name!r}] = packed[at : at + {length}]",
            f"    at += {length}",
            f"  elif {length} != -1:",
            "    raise _refused(packed)",
        ]
    lines += ["  if at != len(packed):", "    raise _refused(packed)", "  return fields"]
    namespace: dict[str, Any] = {
        "_lengths": _LENGTHS.unpack_from,
        "_error": struct.error,
        "_refused": _not_read_fields,
    }
    exec(compile("\n".join(lines), "<unpack>", "exec"), namespace)
    made: Callable[[bytes], dict[bytes, bytes]] = namespace["unpack"]
    return made


_unpack = _unpacker()


_new_record = quick_new(KeyRecord)
"""A KeyRecord from its 19 fields, in order, past the class call: every claim builds
one from the script's reply (see `quick_new`)."""


def record(fields: Mapping[Any, Any]) -> KeyRecord:
    """The [`KeyRecord`][idempotence.testing.harness.KeyRecord] of a record hash (see
    the field list in ``redis.lua``).

    Every replay reads one, so the decoding is spelled out, without a call per field."""
    get = fields.get
    status = get(b"status")
    response = None
    if status is not None:
        headers = read_headers(fields[b"headers"])
        response = new_response(_integer(status), headers, get(b"body", b""))
    locked, last_run, finished, expires = (
        get(b"locked"),
        get(b"last_run"),
        get(b"finished"),
        get(b"expires"),
    )
    error, calling = get(b"error"), get(b"calling")
    try:
        # Strict UTF-8 reads what surrogatepass reads from any bytes it takes, for
        # less; only an encoded surrogate needs the slower spelling.
        scope, key, method, path, fp, flow, rp = (
            fields[b"scope"].decode(),
            fields[b"key"].decode(),
            fields[b"method"].decode(),
            fields[b"path"].decode(),
            fields[b"fp"].decode(),
            fields[b"flow"].decode(),
            fields[b"rp"].decode(),
        )
    except UnicodeDecodeError:
        scope, key, method, path, fp, flow, rp = (
            decode(fields[b"scope"]),
            decode(fields[b"key"]),
            decode(fields[b"method"]),
            decode(fields[b"path"]),
            decode(fields[b"fp"]),
            decode(fields[b"flow"]),
            decode(fields[b"rp"]),
        )
    raw_created = fields[b"created"]
    created = EPOCH + int(raw_created) * MICROSECOND
    return _new_record(
        int(fields[b"id"]),
        scope,
        key,
        method,
        path,
        fp,
        _load_params(fields[b"params"]),
        flow,
        rp,
        _integer(fields[b"token"]),
        None if locked is None else EPOCH + int(locked) * MICROSECOND,
        _duration(fields[b"lto"]),
        response,
        None if error is None else error.decode("utf-8", _TEXT),
        created,
        # A key run once ran when it was made: the same time, read once.
        None
        if last_run is None
        else created
        if last_run == raw_created
        else EPOCH + int(last_run) * MICROSECOND,
        None if finished is None else EPOCH + int(finished) * MICROSECOND,
        None if expires is None else EPOCH + int(expires) * MICROSECOND,
        None if calling is None else calling.decode("utf-8", _TEXT),
    )


def claim_result(
    request: ClaimRequest, record_id: int, args: Sequence[Any], reply: Sequence[Any]
) -> Claim:
    """The claim script's reply (to ``args`` and ``record_id``, from `claim_call`) as a
    [`Claim`][idempotence.states.Claim]: the outcome is named by `claim_from`,
    which refuses a reply that disagrees with [`arbitrate`][idempotence.states.arbitrate]
    (P1-P5 are decided once, in ``states``)."""
    if len(reply) == 2:  # a new key: the script wrote the request, nothing to read
        now = timestamp(reply[1])
        made = new_record(request, record_id, args, now)
        return claim_from(made, request.fingerprint, now, claimed=True)
    claimed, now, packed = reply
    return claim_from(
        record(unpack(packed)), request.fingerprint, timestamp(now), claimed=bool(claimed)
    )


def status_result(reply: Sequence[Any]) -> KeyStatus | None:
    """The ``status`` script's reply as a [`KeyStatus`][idempotence.states.KeyStatus]
    (None: no such record), its state named on the server's clock."""
    if len(reply) == 1:
        return None
    now, packed = reply
    return KeyStatus.of(record(unpack(packed)), timestamp(now))


def new_record(
    request: ClaimRequest, record_id: int, args: Sequence[Any], now: datetime
) -> KeyRecord:
    """The record that the claim script's first branch (P1) wrote for ``request`` at
    ``now``, field by field, as [`record`][idempotence.stores.sql.Dialect.record] would
    read it back. Its lock timeout and retention are the request's own: the script
    stored them in whole microseconds, a timedelta's resolution."""
    retention = request.retention
    return _new_record(
        record_id,
        request.scope,
        request.key,
        request.method,
        request.path,
        request.fingerprint,
        _load_params(args[6]),  # as stored: a tuple comes back a list
        request.flow,
        STARTED,
        1,
        now,
        request.lock_timeout,
        None,
        None,
        now,
        now,
        None,
        None if retention is None else now + retention,
        None,
    )


class _Translated:
    """``with translated():`` raises the library's error for a redis-py error:
    unreachable is StoreUnavailable (P11). A class, not a generator. The scripts of
    a request catch and `translate` instead: a ``try`` costs nothing until it
    catches, a ``with`` two calls per script."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            return
        error = translate(exc)
        if error is not None:
            raise error from exc


def translate(exc: BaseException) -> StoreError | None:
    """The library's error for redis-py's ``exc`` (unreachable: StoreUnavailable,
    P11), None for an error that is not redis-py's (raised as it is)."""
    misconfigured = _misconfigured(exc)
    if misconfigured is not None:
        return StoreMisconfigured(misconfigured)
    if isinstance(exc, _DOWN):
        return StoreUnavailable(f"the Redis key store is unavailable: {exc}")
    if isinstance(exc, redis.exceptions.RedisError):
        return StoreError(f"the Redis key store failed: {exc}")
    return None


def reraise(exc: Exception) -> NoReturn:
    """Raise the library's error for ``exc`` (`translate`), from it; ``exc`` itself
    when it is not redis-py's."""
    error = translate(exc)
    if error is None:
        raise exc
    raise error from exc


def _misconfigured(exc: BaseException) -> str | None:
    """What to fix, when ``exc`` is the server refusing the URL itself: a retry would
    meet the same refusal, so it is a configuration error, not an outage. redis-py
    says so only in its messages (the server's reply, or the cluster discovery's)."""
    text = str(exc)
    if isinstance(exc, redis.exceptions.ResponseError) and "DB index is out of range" in text:
        return (
            "the Redis server has no database of the number the URL gives (after the port, "
            "as in redis://HOST:PORT/0): a server has databases 0 to 15 unless its "
            "`databases` setting says more"
        )
    if isinstance(exc, redis.exceptions.RedisClusterException) and (
        "Cluster mode is not enabled" in text or "cluster support disabled" in text
    ):
        return (
            "the Redis server is not a cluster node (cluster mode is not enabled on it): "
            "use redis://HOST:PORT/DB for a single server, and redis+cluster:// only for a "
            "Redis Cluster"
        )
    return None


_TRANSLATED = _Translated()


def translated() -> _Translated:
    """redis-py's errors as the library's: unreachable is StoreUnavailable (P11)."""
    return _TRANSLATED
