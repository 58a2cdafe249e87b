"""Benchmark code too long for recovery/devtools/management/commands/bench.py (run through `manage.py bench`)."""
