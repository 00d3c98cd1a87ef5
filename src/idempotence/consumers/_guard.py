"""The consumer guard, without I/O: a delivered message as one run of the engine (F6).

`lifecycle` turns a [`Message`][idempotence.consumers.Message] into a run of the
consumer's engine (a one-step flow built from the
[`Consumer`][idempotence.consumers.rabbitmq_pika.Consumer], as an HTTP policy builds
one, or the consumer's own multi-step [`Flow`][idempotence.testing.harness.Flow]) and
the run's result into a [`Disposition`][idempotence.consumers.Disposition]: what the
broker adapter does with the delivery. It yields the engine's effects; the drivers
(`_driver_async`, and `_driver` generated from it) perform them with the flows driver,
so the claim, the heartbeats (F2), the transaction (F3) and the errored mark (R6) are
the engine's, written once.

The decisions (DESIGN 9):

* the key is the message id (or what ``message_id`` derives from the message), in the
  consumer's scope; a message without a usable id is hostile: dead-lettered, no claim;
* done now, or done before (a duplicate delivery): ACK (M1: the adapter acks only
  after this, so after the commit);
* in progress elsewhere, taken over, paused, or the store down: REQUEUE after a delay
  (M2), never acked before it is done and never run twice;
* failed: REQUEUE with the attempt counted; the ``max_attempts``-th failure marks the
  key errored (R6) and dead-letters the message (M3).
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import json
import logging
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from ..errors import ConfigurationError, InvalidKey, StoreError
from ..fingerprint import secret_pair
from ..flows import Flow, FlowResult, ResultKind
from ..flows.effects import Effect
from ..flows.flow import finish_errored
from ..keys import validate_key
from ..problems import Problem, ProblemDetails
from ..states import (
    DEFAULT_HANDLER_LOCK_TIMEOUT,
    ClaimRequest,
    Lease,
    Outcome,
    StoredResponse,
)
from ..stores.capabilities import Capability, capabilities_of

logger = logging.getLogger("idempotence.consumers")

__all__ = [
    "CONSUMER_FLOW",
    "CONSUMER_RETENTION",
    "Action",
    "Consumer",
    "Disposition",
    "HostileMessage",
    "Message",
    "MessageContext",
    "lifecycle",
]

PROCESSED = StoredResponse(200, (), b"")
"""What a handler or transactional consumer's processed key stores."""
CONSUMER_FLOW = "consumer"
"""The flow name stored on the keys of a handler or transactional consumer."""
CONSUMER_RETENTION = timedelta(days=7)
"""M4: how long a consumer's keys are kept by default (a broker's usual retention)."""
_DECODINGS = ("bytes", "text", "json")


class HostileMessage(ValueError):
    """A message the guard cannot key or read: no id, an id that is no valid key
    (over 255 characters, not printable ASCII), a body that is not the declared
    text or JSON. It is dead-lettered without a claim; the consumer goes on."""


@dataclass(frozen=True, slots=True)
class Message:
    """A delivery, broker-neutral: what an adapter hands the guard."""

    body: bytes
    message_id: str | None = None
    """The broker's message id (AMQP ``message_id``), if any."""
    headers: Mapping[str, Any] = field(default_factory=dict)
    attempt: int = 1
    """1 for the first attempt; the adapter carries the count across requeues."""
    redelivered: bool = False
    """The broker says it delivered this message before (a consumer died holding it)."""


@dataclass(slots=True)
class MessageContext:
    """What a consumer's handler is given."""

    message: Message
    payload: Any
    """The body as the consumer decodes it (bytes, text or JSON)."""
    key: str
    """The message's key (its id) and the consumer's scope."""
    scope: str
    lease: Lease
    """The lease of the claimed key: ``lease.id`` names derived keys (R4)."""
    tx: Any = None
    """Transactional mode: the store transaction the claim opened; write in it and the
    writes commit with the processed mark, or not at all (F3). None otherwise."""
    consumer: str = ""

    def key_for(self, name: str) -> str:
        """The derived key for foreign call ``name`` (R4): the same on every attempt."""
        return f"{self.consumer}-{self.lease.id}-{name}"


class Action(enum.Enum):
    """What the adapter does with a delivery."""

    ACK = "ack"
    """Acknowledge: processed now, or before (a duplicate)."""
    REQUEUE = "requeue"
    """Acknowledge only once republished with ``delay`` (M2, or a failed attempt)."""
    DEAD_LETTER = "dead_letter"
    """Acknowledge only once published to the dead-letter queue with ``reason`` (M3)."""


@dataclass(frozen=True, slots=True)
class Disposition:
    """The guard's verdict on one delivery."""

    action: Action
    outcome: str
    """For metrics and logs: processed, duplicate, in_progress, retry, unavailable (the
    key store failed), dead_letter."""
    delay: float = 0.0
    """Seconds to wait before the message is delivered again (REQUEUE)."""
    attempt: int = 1
    """The attempt number the requeued message carries."""
    reason: str = ""
    key: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Consumer:
    """A guarded consumer: its name, its handler or flow, and its settings.

    Exactly one of ``handler`` and ``flow``. ``handler(ctx: MessageContext)`` runs in
    handler mode (any key store: claim, run with heartbeats, finish) or, with
    ``transactional=True``, inside the claim's transaction on a SQL store (F3); its
    return value is ignored. A ``flow`` runs keyed by the message id (M4), with the
    decoded body as its parameters.

    ```python
    Consumer(name="receipts", handler=print, transactional=True).mode
    # 'transaction'
    ```
    """

    name: str
    handler: Callable[[MessageContext], Any] | None = None
    flow: Flow | None = None
    transactional: bool = False
    message_id: Callable[[Message], str | bytes | None] | None = None
    """The key of a message; default: its ``message_id``. May return None (hostile)."""
    scope: str | None = None
    """The keys' scope; default: ``name``."""
    decode: str = "bytes"
    """How the body is read before the claim: ``bytes``, ``text`` (UTF-8) or ``json``."""
    max_attempts: int = 5
    """M3: the failed attempt that dead-letters the message and errors its key."""
    retention: timedelta | None = CONSUMER_RETENTION
    """M4: how long a processed message's key is kept (None: forever). A flow's own."""
    lock_timeout: timedelta = DEFAULT_HANDLER_LOCK_TIMEOUT
    heartbeat: timedelta | None = None
    """F2: extend a running handler's lock this often (handler mode)."""
    retry_delay: timedelta = timedelta(seconds=1)
    """The first delay of a failed attempt's requeue, doubled per attempt up to max_delay."""
    max_delay: timedelta = timedelta(minutes=1)
    fingerprint_secret: str | bytes | None = field(default=None, repr=False)
    """Fingerprint bodies with HMAC-SHA-256 keyed by this secret, not a plain SHA-256
    that a reader of the store could recompute from a guessed body."""
    previous_fingerprint_secret: str | bytes | None = field(default=None, repr=False)
    """While ``fingerprint_secret`` rotates, the secret it replaces: a redelivery of a
    message stored under it still matches; new keys use the new one."""
    secrets: tuple[bytes | None, bytes | None] = field(init=False, repr=False, compare=False)
    engine: Flow = field(init=False, repr=False, compare=False)
    """The engine run of a handler consumer (F6), built once; a flow consumer's is its flow."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigurationError("Consumer.name must be non-empty")
        if (self.handler is None) == (self.flow is None):
            raise ConfigurationError(
                f"Consumer {self.name!r}: give exactly one of handler= and flow="
            )
        if self.flow is not None and self.transactional:
            raise ConfigurationError(
                f"Consumer {self.name!r}: a flow is transactional by phase; give it "
                "request_as_transaction=True instead of transactional=True"
            )
        if self.flow is not None and self.retention != CONSUMER_RETENTION:
            raise ConfigurationError(
                f"Consumer {self.name!r}: a flow keeps its keys by its own retention: "
                "set Flow(retention=...) instead"
            )
        if self.decode not in _DECODINGS:
            raise ConfigurationError(f"Consumer.decode must be one of {_DECODINGS}")
        if self.max_attempts < 1:
            raise ConfigurationError("Consumer.max_attempts must be >= 1")
        if self.retry_delay <= timedelta(0) or self.max_delay < self.retry_delay:
            raise ConfigurationError("Consumer: 0 < retry_delay <= max_delay")
        if self.heartbeat is not None and self.transactional:
            raise ConfigurationError(
                "Consumer.heartbeat needs handler mode: a transactional consumer holds "
                "its transaction open instead of beating"
            )
        owner = f"Consumer {self.name!r}"
        pair = secret_pair(self.fingerprint_secret, self.previous_fingerprint_secret, owner)
        object.__setattr__(self, "secrets", pair)
        object.__setattr__(self, "engine", self.flow or self._engine())

    def _engine(self) -> Flow:
        engine = Flow(
            CONSUMER_FLOW,
            lock_timeout=self.lock_timeout,
            retention=self.retention,
            request_as_transaction=self.transactional,
        )
        # A consumer's stored response is always the same acknowledgement: in
        # transactional mode the claim writes it, and the COMMIT carries no finish.
        engine.handler(limit=1 << 16, heartbeat=self.heartbeat, fixed_response=PROCESSED)
        return engine

    @property
    def mode(self) -> str:
        """``flow``, ``transaction`` or ``handler``."""
        if self.flow is not None:
            return "flow"
        return "transaction" if self.transactional else "handler"

    def check_store(self, store: object) -> None:
        """Refuse a store this consumer cannot run on: transactional and flow consumers
        write in the store's transaction, which only a SQL store has (F3, R2)."""
        if self.mode != "handler" and Capability.TRANSACTIONS not in capabilities_of(store):
            raise ConfigurationError(
                f"Consumer {self.name!r} runs in {self.mode} mode and needs a SQL store "
                f"(PostgreSQL or SQLite), not {type(store).__name__}: only handler mode "
                "runs on any key store"
            )

    @property
    def key_scope(self) -> str:
        return self.scope or self.name

    def key_of(self, message: Message) -> str:
        """The message's key; [`HostileMessage`][idempotence.consumers.HostileMessage]
        when it has none usable."""
        try:
            raw = message.message_id if self.message_id is None else self.message_id(message)
        except HostileMessage:
            raise
        except Exception as exc:
            raise HostileMessage(f"its id could not be derived: {exc!r}") from exc
        if raw is None or raw == "" or raw == b"":
            raise HostileMessage("it has no message id")
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("ascii")
            except UnicodeDecodeError:
                raise HostileMessage("its message id is not ASCII text") from None
        if not isinstance(raw, str):
            raise HostileMessage(f"its message id is a {type(raw).__name__}, not text")
        try:
            return validate_key(raw, subject="The message id")
        except InvalidKey as exc:
            shown = f"{len(raw)} characters" if len(raw) > 80 else repr(raw)
            raise HostileMessage(f"its message id ({shown}) is no valid key: {exc}") from None

    def payload_of(self, message: Message) -> Any:
        """The body as ``decode`` says;
        [`HostileMessage`][idempotence.consumers.HostileMessage] when it is not."""
        if self.decode == "bytes":
            return message.body
        try:
            text = message.body.decode("utf-8")
            return text if self.decode == "text" else json.loads(text)
        except UnicodeDecodeError as exc:
            raise HostileMessage(f"its body is not UTF-8 text: {exc}") from None
        except ValueError as exc:
            raise HostileMessage(f"its body is not JSON: {exc}") from None

    def request(self, key: str, message: Message, payload: Any) -> ClaimRequest:
        """The claim request of ``message``: keyed by its id, fingerprinted by its body
        (the same id with another body is a MISMATCH, P2)."""
        params: Any = {}
        if self.flow is not None:
            params = _params(payload)
        current, previous = self.secrets
        return self.engine.request(
            scope=self.key_scope,
            key=key,
            fingerprint=_digest(message.body, current),
            params=params,
            method="CONSUME",
            path=self.name,
            previous_fingerprint=None if previous is None else _digest(message.body, previous),
        )

    def backoff(self, attempt: int) -> float:
        """Seconds before failed attempt ``attempt`` is tried again."""
        delay = self.retry_delay * (2 ** min(attempt - 1, 30))
        return float(min(delay, self.max_delay).total_seconds())


def _digest(body: bytes, secret: bytes | None) -> str:
    if secret is None:
        return hashlib.sha256(body).hexdigest()
    return hmac.new(secret, body, hashlib.sha256).hexdigest()


def _params(payload: Any) -> Any:
    if isinstance(payload, bytes):
        return {"body_base64": base64.b64encode(payload).decode("ascii")}
    if isinstance(payload, str):
        return {"body": payload}
    return payload


# -- the run ---------------------------------------------------------------------------------


Guarded = Generator[Effect, Any, Disposition]


def lifecycle(consumer: Consumer, message: Message, make_app: Callable[[str, Any], Any]) -> Guarded:
    """One delivery through the guard (see the module docstring). ``make_app(key,
    payload)`` makes what runs the handler for the engine
    ([`DoHandle`][idempotence.http.wsgi.DoHandle])."""
    try:
        key = consumer.key_of(message)
        payload = consumer.payload_of(message)
    except HostileMessage as exc:
        return _dead_letter(consumer, None, f"hostile message: {exc}")
    request = consumer.request(key, message, payload)
    engine = consumer.engine.engine(request, app=make_app(key, payload))
    try:
        result = yield from engine
    except StoreError as exc:  # a flow's claim or checkpoint: the store, not the message
        return _unavailable(consumer, message, request.key, exc)
    except Exception as exc:  # the handler's: it rolled back, or its key was released
        return (yield from _failed(consumer, message, request, exc))
    return (yield from _decide(consumer, message, request, result))


def _decide(
    consumer: Consumer, message: Message, request: ClaimRequest, result: FlowResult
) -> Guarded:
    key, kind = request.key, result.kind
    if kind is ResultKind.EXECUTED or kind is ResultKind.SENT:
        return Disposition(Action.ACK, "processed", key=key)
    if kind is ResultKind.REPLAYED:
        return Disposition(Action.ACK, "duplicate", key=key)
    if kind is ResultKind.MISMATCH:
        reason = "another message with this id and a different body was processed"
        return _dead_letter(consumer, key, reason)
    if kind is ResultKind.REJECTED:
        return _dead_letter(consumer, key, "the flow rejected the message")
    if kind is ResultKind.ERRORED:
        return _dead_letter(consumer, key, f"the key is errored: {result.error!r}")
    error = result.error
    if kind is ResultKind.FAILED and error is not None and not isinstance(error, StoreError):
        return (yield from _failed(consumer, message, request, error))
    # IN_PROGRESS, LOST, PAUSED, or the store down: try again later, uncounted (M2).
    retry_after = result.claim.retry_after if result.claim is not None else None
    delay = min(max(retry_after or 0.0, consumer.retry_delay.total_seconds()), 60.0)
    if isinstance(error, StoreError):
        return _unavailable(consumer, message, key, error)
    return Disposition(
        Action.REQUEUE,
        "in_progress",
        delay=delay,
        attempt=message.attempt,
        reason=kind.value,
        key=key,
    )


def _unavailable(consumer: Consumer, message: Message, key: str, error: StoreError) -> Disposition:
    """The key store failed: nothing ran, or everything rolled back (P11). The message
    waits for the store, its attempt uncounted."""
    logger.warning("consumer %r: key store failed, requeueing %r: %s", consumer.name, key, error)
    delay = consumer.retry_delay.total_seconds()
    return Disposition(
        Action.REQUEUE, "unavailable", delay=delay, attempt=message.attempt, reason=str(error)
    )


def _failed(
    consumer: Consumer, message: Message, request: ClaimRequest, exc: BaseException
) -> Guarded:
    """A failed attempt: requeued with its count, or, the ``max_attempts``-th, the key
    marked errored (R6) and the message dead-lettered (M3)."""
    attempt, key = message.attempt, request.key
    if attempt < consumer.max_attempts:
        logger.warning(
            "consumer %r: message %r failed (attempt %d of %d), retrying: %r",
            consumer.name, key, attempt, consumer.max_attempts, exc,
        )  # fmt: skip
        delay = consumer.backoff(attempt)
        return Disposition(
            Action.REQUEUE, "retry", delay=delay, attempt=attempt + 1, reason=repr(exc), key=key
        )
    reason = f"poison message: {attempt} failed attempts, the last: {exc!r}"
    try:
        marked = yield from mark_errored(request, reason)
    except StoreError as store_exc:
        # Not marked: never dead-letter a message whose key is not errored; try again.
        logger.warning("consumer %r: could not error key %r: %s", consumer.name, key, store_exc)
        delay = consumer.backoff(attempt)
        return Disposition(
            Action.REQUEUE, "unavailable", delay=delay, attempt=attempt, reason=str(store_exc)
        )
    if marked is Outcome.REPLAY:
        return Disposition(Action.ACK, "duplicate", key=key)
    if marked is Outcome.IN_PROGRESS:
        delay = consumer.backoff(1)
        return Disposition(Action.REQUEUE, "in_progress", delay=delay, attempt=attempt, key=key)
    return _dead_letter(consumer, key, reason)


def mark_errored(request: ClaimRequest, reason: str) -> Generator[Effect, Any, Outcome]:
    """R6 for a run that gave up: claim the key and finish it errored, so it is
    listed for a human (``idempotence keys list --state errored``) and every later
    delivery of it is absorbed. Returns the claim's outcome."""
    detail = f"This message was dead-lettered: {reason}"
    response = ProblemDetails.of(Problem.OUTCOME_UNKNOWN, detail).stored()
    claim = yield from finish_errored(request, response, reason)
    return claim.outcome


def _dead_letter(consumer: Consumer, key: str | None, reason: str) -> Disposition:
    logger.error("consumer %r: dead-lettering message %r: %s", consumer.name, key, reason)
    return Disposition(Action.DEAD_LETTER, "dead_letter", reason=reason, key=key)
