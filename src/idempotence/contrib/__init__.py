"""Framework glue for :mod:`idempotence.http`: one small module per framework.

* :mod:`.django`: a Django middleware configured by ``settings.IDEMPOTENCE``;
* :mod:`.flask`: :func:`~.flask.install` wraps ``app.wsgi_app``;
* :mod:`.litestar`: :func:`~.litestar.idempotency_middleware` for ``Litestar(middleware=...)``.

Starlette and FastAPI need no glue: ``app.add_middleware(IdempotencyMiddleware, config=...)``.
"""
