"""The consumers guide's Kafka-style adapter, as written there, over an in-memory partition log:
offsets are committed only after the transaction, so a consumer that dies between its
commit and its offset commit replays records that the keys absorb (M1)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from idempotence import SqliteStore
from idempotence.consumers import Consumer, MessageContext

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "consumers.md"


def readme_consume() -> Any:
    text = GUIDE.read_text(encoding="utf-8")
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "def consume(" in b)
    namespace: dict[str, Any] = {}
    exec(compile(block, str(GUIDE), "exec"), namespace)
    return namespace["consume"]


@dataclass
class Record:
    key: str
    value: bytes
    offset: int
    headers: list[tuple[str, str]] = field(default_factory=list)


class Died(Exception):
    """The consumer process died (here: at a chosen point)."""


class Partition:
    """One partition's log and its committed offset; ``die_before_commit`` names the
    offsets whose commit the consumer dies before (once each)."""

    def __init__(self, records: list[Record], die_before_commit: set[int]) -> None:
        self.records, self.committed = records, 0
        self.position = 0
        self.die_before_commit = set(die_before_commit)
        self.published: list[tuple[str, bytes]] = []

    def restart(self) -> None:
        self.position = self.committed  # a new consumer starts at the committed offset

    def poll(self) -> Record:
        if self.position >= len(self.records):
            raise Died("end of the log")
        record = self.records[self.position]
        self.position += 1
        return record

    def commit(self, offset: int) -> None:
        if offset - 1 in self.die_before_commit:
            self.die_before_commit.discard(offset - 1)
            raise Died(f"died before committing offset {offset}")
        self.committed = offset

    def publish(self, topic: str, value: bytes, **_: Any) -> None:
        self.published.append((topic, value))


def test_the_readme_kafka_adapter_commits_offsets_after_the_transaction(
    consumer_sqlite_path: str,
) -> None:
    consume = readme_consume()
    ids = [f"order-{i}" for i in range(20)] + ["order-3", "order-7"]  # two republished
    records = [Record(key, b"{}", offset) for offset, key in enumerate(ids)]
    log = Partition(records, die_before_commit={2, 5, 11, 20})

    def handle(ctx: MessageContext) -> None:
        ctx.tx.execute("INSERT INTO effects (message_id, pid) VALUES (?, 0)", (ctx.key,))

    consumer = Consumer(name="orders", handler=handle, transactional=True)
    deaths = 0
    with SqliteStore(consumer_sqlite_path) as store:
        while log.committed < len(records):
            log.restart()
            try:
                consume(log, consumer, store)
            except Died:
                deaths += 1
        with store.transaction() as tx:
            rows = tx.execute("SELECT message_id, count(*) AS n FROM effects GROUP BY message_id")
    assert deaths >= 4
    assert {row["message_id"]: row["n"] for row in rows} == {f"order-{i}": 1 for i in range(20)}
    assert log.published == []
