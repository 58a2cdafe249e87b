"""The tamper-evident audit trail (docs/design/audit.md): the hash chain, the action names and the checkpoints kept
outside the database."""
