"""The demo agent: a small agent runtime that calls side-effecting tools the way Recovery Console asks runtimes to.

It stands outside the product like any runtime would: it talks to the console only through `recovery.client` (the
JSON API) and to the provider only with `requests`, and imports no model, service or engine code. `runtime` is the
loop (admit, send, report, obey the decision card); `scenarios` are the demo's stories with their pinned ends.
"""
