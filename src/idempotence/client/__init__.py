"""A retrying client for idempotent requests, over httpx, sync and async (DESIGN 10).

The other half of the protocol: one ``Idempotency-Key`` per logical operation, sent
with every retry; retries after a dropped connection, a 409 for a key in progress, a
429 or a 5xx, with exponential backoff and full jitter or the server's
``Retry-After``; a total deadline and a maximum number of attempts; a stored 4xx is
final; the answer says whether it was replayed and how many attempts it took.

```python
import httpx
from idempotence.client import IdempotentClient, Retry
with httpx.Client(base_url="https://api.example.com") as http:
    answer = IdempotentClient(http).post("/v1/charges", json={"amount": 20})
    answer.status_code, answer.replayed
# (201, False)
```

Needs httpx (the ``client`` extra: ``pip install idempotence[client]``).
"""

from __future__ import annotations

from ..errors import ClientError, KeyReused, RetriesExhausted
from ._client import IdempotentClient
from ._client_async import AsyncIdempotentClient
from ._retry import (
    KEY_HEADER,
    REPLAYED_HEADER,
    Attempt,
    IdempotentResponse,
    Observe,
    Prepare,
    Retry,
    Verdict,
    classify,
    new_key,
    parse_retry_after,
)

__all__ = [
    "KEY_HEADER",
    "REPLAYED_HEADER",
    "AsyncIdempotentClient",
    "Attempt",
    "ClientError",
    "IdempotentClient",
    "IdempotentResponse",
    "KeyReused",
    "Observe",
    "Prepare",
    "Retry",
    "RetriesExhausted",
    "Verdict",
    "classify",
    "new_key",
    "parse_retry_after",
]
