"""The one state mover of calls and compensation entries (docs/design/state-machine.md): the transition function,
the database guards generated from the same edge tables, the hot paths' statements, and waiting for a call to move."""
