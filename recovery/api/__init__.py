"""The JSON API for agent runtimes (docs/api.md): routes, their inputs and answers, errors, the metrics endpoint,
OpenTelemetry trace ingest and the Prometheus exposition."""
