"""Writes: `<entity>_<action>(*, keyword_only)` functions, each one transaction with its audit event."""
