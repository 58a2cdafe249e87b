"""The sandbox provider: a stand-in for the outside world (payments and refunds, orders and shipments, access grants).

It runs as its own process (`manage.py runsandbox`) with its own SQLite store and shares nothing with the product but
HTTP: this package imports only the standard library and `requests` — no Django, no model, service or engine code —
so that what it reports to a drill is evidence, not an echo of the product's own state (docs/sandbox.md).

Modules: `kinds` (the write operations and their validation), `store` (SQLite: idempotency records, objects, the
ledger of business effects, the request and callback logs), `faults` (fault injection), `callbacks` (signed
deliveries from background threads), `app` (routing and the business routes), `admin` (the `/_sandbox/*` routes),
`server` (the threaded HTTP server).
"""
