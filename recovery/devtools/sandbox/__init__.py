"""The sandbox provider: a stand-in for the outside world (payments and refunds, orders and shipments, access grants)
in its own process (`manage.py runsandbox`) with its own SQLite store. It imports only the standard library and
`requests`, never the product, so what it reports is evidence (docs/sandbox.md, which also lists its modules).
"""
