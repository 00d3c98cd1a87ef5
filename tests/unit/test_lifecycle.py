"""The HTTP lifecycle (:func:`idempotence.http._core.lifecycle`) driven directly, with
no database and no framework: every problem code it can answer, in both wire profiles,
on handler, request-as-transaction (F3) and flow endpoints (P2, P4, P7, P11, R5, R6, F1,
F6).

Each row scripts the effects the lifecycle yields, its own (ResolveScope, ReadBody)
and the one engine's (DoClaim, DoHandle, DoInTransaction, DoPhase...): for each, the
value to send back, or the exception to throw in. The row then names the problem the
reply must carry.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from idempotence.errors import (
    BodyTooLarge,
    ConfigurationError,
    LockLost,
    StoreError,
    StoreUnavailable,
)
from idempotence.flows import (
    STORED_SERVER_ERROR,
    Advance,
    Captured,
    DoClaim,
    DoFinish,
    DoHandle,
    DoInTransaction,
    DoPhase,
    DoRelease,
    Flow,
    indeterminate_response,
)
from idempotence.http import (
    Idempotency,
    KeyScope,
    Policy,
    Problem,
    Profile,
    RequestInfo,
    request_fingerprint,
    single_tenant,
)
from idempotence.http._core import lifecycle
from idempotence.http._effects import (
    Detach,
    ReadBody,
    ReadKey,
    ReadStatus,
    Reply,
    ReplyKind,
    ResolveScope,
)
from idempotence.maintenance.completer import GAVE_UP_RESPONSE
from idempotence.maintenance.reaper import EXPIRED_RESPONSE
from idempotence.problems import NEUTRAL_TYPE, ProblemDetails
from idempotence.states import Claim, KeyRecord, KeyState, KeyStatus, Lease, Outcome, StoredResponse

# -- a scripted driver ----------------------------------------------------------------------

#: (the effect type expected next, what it returns: a value, or an exception to raise)
Step = tuple[type, Any]


def drive(
    config: Idempotency,
    policy: Policy,
    request: RequestInfo,
    script: Sequence[Step],
    yielded: list[Any] | None = None,
) -> Reply:
    """Run the lifecycle through ``script`` and return its Reply; the effects it
    yielded are appended to ``yielded``. An exception it lets out propagates."""
    engine = lifecycle(config, policy, request, app=None)
    yielded = [] if yielded is None else yielded
    try:
        effect = next(engine)
        for expected, outcome in script:
            assert isinstance(effect, expected), f"expected {expected.__name__}, got {effect!r}"
            yielded.append(effect)
            if isinstance(outcome, BaseException):
                effect = engine.throw(outcome)
            else:
                effect = engine.send(outcome)
        raise AssertionError(f"the script ended, but the lifecycle asked for {effect!r}")
    except StopIteration as done:
        reply: Reply = done.value
        return reply


def scripted_tenant(request: RequestInfo) -> str:
    """A scope callable the lifecycle asks the driver to call (a `ResolveScope` effect,
    which the scripts answer); `single_tenant`'s constant is read without one."""
    return "tenant"


# -- the pieces of a script ----------------------------------------------------------------

NOW = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = Lease(id=7, scope="tenant", key="k", token=1, recovery_point="started")
EXPIRED_STATUS = KeyStatus(
    scope="tenant",
    key="k",
    state=KeyState.EXPIRED,
    now=NOW + timedelta(days=2),
    created_at=NOW,
    finished_at=NOW,
    expires_at=NOW + timedelta(days=1),
    response_status=201,
)


def record(response: StoredResponse | None = None) -> KeyRecord:
    return KeyRecord(
        id=7,
        scope="tenant",
        key="k",
        method="POST",
        path="/charges",
        fingerprint="f" * 64,
        params={},
        flow="http",
        recovery_point="finished" if response else "started",
        lock_token=1,
        locked_at=None if response else NOW,
        lock_timeout=timedelta(seconds=60),
        response=response,
        error=None,
        created_at=NOW,
        last_run_at=NOW,
        finished_at=NOW if response else None,
        expires_at=NOW + timedelta(days=1),
    )


EXECUTE = Claim(Outcome.EXECUTE, record(), lease=LEASE)
#: A key whose non-idempotent call "charge" began in a worker that died (R6).
CRASHED_IN_CALL = Claim(
    Outcome.EXECUTE,
    record(),
    lease=Lease(
        id=7, scope="tenant", key="k", token=2, recovery_point="charging", calling="charge"
    ),
)
MISMATCH = Claim(Outcome.MISMATCH, record())
IN_PROGRESS = Claim(Outcome.IN_PROGRESS, record(), retry_after=3.0)


def replay(response: StoredResponse) -> Claim:
    return Claim(Outcome.REPLAY, record(response))


#: Everything before the claim, for a request that passes every check.
ADMITTED: list[Step] = [(ResolveScope, "tenant"), (ReadBody, b'{"amount": 1}')]
PLAIN = Policy()
TRANSACTION = Policy(transaction=True)
UNIT_FLOW = Flow("unit-lifecycle")
UNIT_FLOW.phase("started")(lambda ctx: Advance("charging"))
UNIT_FLOW.foreign(
    "charging", name="charge", call=lambda ctx: None, record=lambda ctx, r: None, idempotent=False
)
FLOW = Policy(flow=UNIT_FLOW)
#: An asynchronous flow endpoint, and the GET of an operation's status URL.
ACCEPTING = Policy(flow=UNIT_FLOW, asynchronous=True)
MODES = {"handler": PLAIN, "transaction": TRANSACTION, "flow": FLOW, "status": ACCEPTING}


def claimed(mode: str, claim: Claim) -> list[Step]:
    """The script of a claim that ``mode`` did not win (P2, P3, P4)."""
    if mode == "transaction":
        return [*ADMITTED, (DoInTransaction, (claim, None))]
    return [*ADMITTED, (DoClaim, claim)]


def store_fails(mode: str, exc: StoreError) -> list[Step]:
    """The script of a store that fails at the claim (P11)."""
    first = DoInTransaction if mode == "transaction" else DoClaim
    return [*ADMITTED, (first, exc)]


def flow_runs(*steps: Step) -> list[Step]:
    """A flow endpoint's run, from its claim on."""
    return [*ADMITTED, *steps]


# -- the table -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    mode: str
    code: str
    #: The IETF status; Stripe's is the same except for a reused key (400).
    status: int
    script: list[Step]
    headers: tuple[tuple[str, str], ...] = (("content-type", "application/json"),)
    key: tuple[str, ...] = ("k",)
    replayed: bool = False
    query: str = ""


#: The library's problems that are stored with a key, by code, in their neutral form.
STORED = {
    "internal_error": (500, STORED_SERVER_ERROR),
    "outcome_unknown": (502, indeterminate_response("charge")),
    "request_abandoned": (500, GAVE_UP_RESPONSE),
    "request_expired": (408, EXPIRED_RESPONSE),
    "response_not_replayable": (
        500,
        ProblemDetails.of(Problem.RESPONSE_NOT_REPLAYABLE, "too large").stored(),
    ),
}


def replayed(mode: str, code: str) -> Row:
    status, stored = STORED[code]
    return Row(mode, code, status, claimed(mode, replay(stored)), replayed=True)


def rows() -> list[Row]:
    table: list[Row] = []
    for mode in ("handler", "transaction", "flow"):
        table += [
            # P7, P8: the key, before anything else.
            Row(mode, "idempotency_key_missing", 400, [], key=()),
            Row(mode, "idempotency_key_invalid", 400, [], key=('"unterminated',)),
            Row(mode, "idempotency_key_repeated", 400, [], key=("a", "b")),
            Row(mode, "idempotency_tenant_unknown", 401, [(ResolveScope, None)]),
            # P7: too large, as declared (nothing read) or as read.
            Row(
                mode,
                "request_body_too_large",
                413,
                [(ResolveScope, "tenant")],
                headers=(("content-type", "application/json"), ("content-length", "99999999")),
            ),
            Row(
                mode,
                "request_body_too_large",
                413,
                [(ResolveScope, "tenant"), (ReadBody, BodyTooLarge())],
            ),
            Row(mode, "request_body_invalid", 400, [(ResolveScope, "tenant"), (ReadBody, b"{")]),
            # P2, P4: a claim this request did not win.
            Row(mode, "idempotency_key_reused", 422, claimed(mode, MISMATCH)),
            Row(mode, "idempotency_key_in_use", 409, claimed(mode, IN_PROGRESS)),
            # P11: the store down, or failing otherwise.
            Row(mode, "idempotency_store_unavailable", 503, store_fails(mode, StoreUnavailable())),
            Row(mode, "idempotency_store_failed", 500, store_fails(mode, StoreError("disk"))),
        ]
        # F6: a problem stored neutral replays rendered, whoever stored it (R5: the
        # middleware or a flow; R6: a flow; B2: the completer; B3: the reaper).
        table += [replayed(mode, code) for code in STORED if code != "response_not_replayable"]
    table += [
        # Stored by a handler endpoint whose response was too large to keep.
        replayed("handler", "response_not_replayable"),
        # F3: a response too large to store rolls the whole request back.
        Row(
            "transaction",
            "response_too_large",
            500,
            [*ADMITTED, (DoInTransaction, (EXECUTE, Captured(201, (), b"", overflowed=True)))],
        ),
        # F3: the commit refused (taken over) or lost: everything rolled back.
        Row(
            "transaction",
            "idempotency_store_failed",
            500,
            [*ADMITTED, (DoInTransaction, LockLost("taken over"))],
        ),
        # A flow reads JSON and forms only.
        Row(
            "flow",
            "request_body_unsupported",
            415,
            [(ResolveScope, "tenant"), (ReadBody, b"plain")],
            headers=(("content-type", "text/plain"),),
        ),
        # F1: another worker took the key over mid-run.
        Row(
            "flow",
            "idempotency_key_taken_over",
            409,
            flow_runs((DoClaim, EXECUTE), (DoPhase, LockLost("taken"))),
        ),
        # R5: a phase raised (the drift: this was problem+json without a code).
        Row(
            "flow",
            "internal_error",
            500,
            flow_runs((DoClaim, EXECUTE), (DoPhase, RuntimeError()), (DoRelease, None)),
        ),
        # R6: a non-idempotent call of unknown outcome errors the key.
        Row(
            "flow",
            "outcome_unknown",
            502,
            flow_runs((DoClaim, CRASHED_IN_CALL), (DoFinish, None)),
        ),
        # A flow whose run failed on the store after claiming (the phase's commit).
        Row(
            "flow",
            "idempotency_store_unavailable",
            503,
            flow_runs((DoClaim, EXECUTE), (DoPhase, StoreUnavailable()), (DoRelease, None)),
        ),
        # DESIGN 13: the phase's COMMIT landed but the partition lost its answer, and
        # the release after it is refused (our own phase finished the key): the outcome
        # is unknown, not a takeover, so 503 (it was 409 "taken over").
        Row(
            "flow",
            "idempotency_store_unavailable",
            503,
            flow_runs(
                (DoClaim, EXECUTE),
                (DoPhase, StoreUnavailable("cut off")),
                (DoRelease, LockLost("finished")),
            ),
        ),
        # ...while a refused release after any other failure is still a takeover.
        Row(
            "flow",
            "idempotency_key_taken_over",
            409,
            flow_runs(
                (DoClaim, EXECUTE), (DoPhase, RuntimeError()), (DoRelease, LockLost("taken"))
            ),
        ),
        # The status URL of an operation this tenant never started.
        Row(
            "status",
            "idempotency_operation_unknown",
            404,
            [(ResolveScope, "tenant"), (ReadKey, None)],
        ),
        # A key's status URL: a key the tenant does not hold, one past its retention
        # (not yet deleted), and a query that names half an endpoint.
        Row(
            "key-status", "idempotency_key_unknown", 404, [(ResolveScope, "t"), (ReadStatus, None)]
        ),
        Row(
            "key-status",
            "idempotency_key_expired",
            410,
            [(ResolveScope, "tenant"), (ReadStatus, EXPIRED_STATUS)],
        ),
        Row("key-status", "idempotency_status_query_invalid", 400, [], query="method=POST"),
    ]
    return table


ROWS = rows()


def policy_for(config: Idempotency, row: Row) -> Policy:
    """The policy ``config`` resolves the row's request to."""
    if row.mode == "key-status":
        assert config.key_status_policy is not None
        return config.key_status_policy
    return MODES[row.mode]


WIRE = {Profile.IETF: "application/problem+json", Profile.STRIPE: "application/json"}


def row_id(row: Row) -> str:
    return f"{row.mode}-{row.code}-{ROWS.index(row)}"


def request_for(row: Row) -> RequestInfo:
    if row.mode == "key-status":
        return RequestInfo("GET", "/keys/k", query=row.query, path_params={"key": "k"})
    if row.mode == "status":
        return RequestInfo("GET", "/idempotence/operations/k", path_params={"key": "k"})
    keys = tuple(("idempotency-key", key) for key in row.key)
    return RequestInfo("POST", "/charges", headers=(*row.headers, *keys))


@pytest.mark.parametrize("profile", list(Profile), ids=lambda p: p.value)
@pytest.mark.parametrize("row", ROWS, ids=row_id)
def test_f6_every_problem_in_both_profiles(row: Row, profile: Profile) -> None:
    config = Idempotency(
        store=object(), scope=scripted_tenant, profile=profile, key_status_path="/keys"
    )
    reply = drive(config, policy_for(config, row), request_for(row), row.script)

    assert reply.kind is ReplyKind.RESPOND and reply.response is not None
    response = reply.response
    headers = dict(response.headers)
    stripe_reused = profile is Profile.STRIPE and row.code == "idempotency_key_reused"
    assert response.status == (400 if stripe_reused else row.status)
    assert headers["content-type"] == WIRE[profile]
    body = json.loads(response.body)
    if profile is Profile.STRIPE:
        assert body["error"]["code"] == row.code
        assert body["error"]["message"]
    else:
        assert (body["code"], body["status"]) == (row.code, row.status)
        assert body["detail"]
    assert headers["content-length"] == str(len(response.body))
    assert (headers.get("idempotent-replayed") == "true") is row.replayed


def test_f6_the_table_covers_every_problem_code() -> None:
    assert {row.code for row in ROWS} == {problem.code for problem in Problem}


def test_p4_p11_refusals_that_invite_a_retry_say_when() -> None:
    config = Idempotency(store=object(), scope=scripted_tenant)
    for row in ROWS:
        if row.code in ("idempotency_key_in_use", "idempotency_store_unavailable"):
            reply = drive(config, policy_for(config, row), request_for(row), row.script)
            assert reply.response is not None
            assert dict(reply.response.headers)["retry-after"].isdigit(), row


# -- what the lifecycle stores is neutral (F6) ------------------------------------------------

STRIPE = Idempotency(store=object(), scope=scripted_tenant, profile=Profile.STRIPE)
JSON_REQUEST = RequestInfo(
    "POST", "/charges", headers=(("content-type", "application/json"), ("idempotency-key", "k"))
)


def test_f6_r5_a_stored_server_error_is_neutral_whatever_the_profile() -> None:
    effects: list[Any] = []
    script = [*ADMITTED, (DoClaim, EXECUTE), (DoHandle, RuntimeError("boom")), (DoFinish, None)]
    with pytest.raises(RuntimeError, match="boom"):  # the framework answers the 500
        drive(STRIPE, Policy(store_server_errors=True), JSON_REQUEST, script, effects)
    finish = effects[-1]
    assert dict(finish.response.headers)["content-type"] == NEUTRAL_TYPE
    details = ProblemDetails.from_stored(finish.response)
    assert details is not None and details.problem is Problem.SERVER_ERROR


def test_f6_a_response_too_large_to_store_is_stored_neutral() -> None:
    effects: list[Any] = []
    overflowed = Captured(201, (), b"", overflowed=True)
    script = [*ADMITTED, (DoClaim, EXECUTE), (DoHandle, overflowed)]
    reply = drive(STRIPE, Policy(), JSON_REQUEST, script, effects)
    assert reply.kind is ReplyKind.SENT
    run = effects[-1]
    assert run.on_overflow is not None
    finish = run.on_overflow(201)  # what the driver stores just before streaming it
    assert isinstance(finish, DoFinish) and finish.error
    details = ProblemDetails.from_stored(finish.response)
    assert details is not None and details.problem is Problem.RESPONSE_NOT_REPLAYABLE


# -- asynchronous acceptance: the request never runs the flow itself ---------------------------

ACCEPT_CONFIG = Idempotency(store=object(), scope=scripted_tenant)


def test_accepting_claims_releases_detaches_then_answers_202() -> None:
    effects: list[Any] = []
    script = [*ADMITTED, (ReadKey, None), (DoClaim, EXECUTE), (DoRelease, None), (Detach, None)]
    reply = drive(ACCEPT_CONFIG, ACCEPTING, JSON_REQUEST, script, effects)
    assert reply.response is not None and reply.response.status == 202
    headers = dict(reply.response.headers)
    assert headers["location"] == headers["content-location"] == "/idempotence/operations/k"
    assert headers["retry-after"] == "1"
    # The released lease is the claim's; the background run is the flow's own run.
    assert effects[-2].lease is LEASE
    assert effects[-1].flow is UNIT_FLOW and effects[-1].request.key == "k"


@pytest.mark.parametrize(
    ("found", "status"),
    [
        ("running", 202),  # never taken over by a request: only the run or the completer
        ("finished", 201),
        ("another request", 422),
    ],
)
def test_accepting_a_known_key_only_reads_it(found: str, status: int) -> None:
    admitted = [(ResolveScope, "tenant"), (ReadBody, b"{}")]
    fingerprint = request_fingerprint(JSON_REQUEST, b"{}", ())
    stored = StoredResponse.of(201, {"content-type": "application/json"}, b"{}")
    existing = record(stored if found == "finished" else None)
    if found != "another request":
        existing = dataclasses.replace(existing, fingerprint=fingerprint)
    effects: list[Any] = []
    reply = drive(ACCEPT_CONFIG, ACCEPTING, JSON_REQUEST, [*admitted, (ReadKey, existing)], effects)
    assert reply.response is not None and reply.response.status == status
    assert [type(effect) for effect in effects] == [ResolveScope, ReadBody, ReadKey]
    replayed = dict(reply.response.headers).get("idempotent-replayed")
    assert replayed == ("true" if found == "finished" else None)


def test_single_tenant_is_read_without_asking_the_driver() -> None:
    # A constant tenant needs no effect: the lifecycle goes from the key to the body,
    # and the claim is in that tenant's scope.
    config = Idempotency(store=object(), scope=single_tenant("shop"))
    effects: list[Any] = []
    script = [
        (ReadBody, b'{"amount": 1}'),
        (DoClaim, EXECUTE),
        (DoHandle, Captured(201, (), b"{}")),
    ]
    drive(config, Policy(), JSON_REQUEST, [*script, (DoFinish, None)], effects)
    assert [type(effect) for effect in effects] == [ReadBody, DoClaim, DoHandle, DoFinish]
    assert effects[1].request.scope == "shop"


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        ({}, "needs a flow"),
        ({"flow": UNIT_FLOW, "key_scope": KeyScope.ENDPOINT}, "KeyScope.TENANT"),
        ({"flow": UNIT_FLOW, "scope": single_tenant()}, "do not override scope"),
        ({"flow": UNIT_FLOW, "wait": timedelta(seconds=1)}, "cannot wait"),
    ],
)
def test_asynchronous_acceptance_is_refused_where_it_cannot_work(
    settings: dict[str, Any], why: str
) -> None:
    with pytest.raises(ConfigurationError, match=why):
        Policy(asynchronous=True, **settings)
