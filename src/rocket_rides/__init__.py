"""Rocket Rides: a demo service on idempotence, and the run that proves it exactly-once.

* `api`: the Rocket Rides API (Starlette) on the idempotency middleware, with the
  ride flow of `rides` (create the ride, charge $20, stage the receipt);
* `provider`: a fake payment provider as an HTTP service, with injected faults;
* `mailer`: a fake mailer and the ``send_receipt`` job;
* `stack`: the processes (provider, API workers, background worker) under one
  supervisor that restarts whichever dies;
* `run`: the demo's main job: simulated clients retrying through crashes, then
  a reconciliation of rides, charges and receipts (`report`);
* `cli`: ``idempotence demo`` and ``idempotence demo serve``.
"""
