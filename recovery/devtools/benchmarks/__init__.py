"""Benchmark code too long for recovery/management/commands/bench.py (run through `manage.py bench`)."""
