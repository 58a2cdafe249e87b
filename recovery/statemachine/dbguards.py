"""The database triggers no code path can bypass: the call and compensation-entry state tables, the append-only audit
trail and its forward-only heads (docs/design/state-machine.md, docs/design/audit.md). Any change here, to the state
tables or to a guarded table needs a new migration with the SQL then generated frozen in it (as 0027 does):
tests/test_states.py and tests/test_audit.py fail until there is one.
"""

from __future__ import annotations

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created

from recovery.engine.compensation_states import ALLOWED_PAIRS as ENTRY_PAIRS
from recovery.engine.states import ALLOWED_PAIRS

SETTING = "recovery.audit_maintenance"
# How far a head may count: the events its chain holds (recovery.audit.chain.GLOBAL, "global", counts every event). A
# head is moved once per transaction to cover the events just inserted (recovery.audit.chain._append_all), never past
# them.
_EVENTS_COUNTED = (
    "(CASE WHEN NEW.key = 'global' THEN (SELECT coalesce(max(seq), 0) FROM recovery_auditevent) "
    "ELSE (SELECT coalesce(max(chain_seq), 0) FROM recovery_auditevent WHERE chain = NEW.key) END)"
)


def _edge_list(pairs: tuple[tuple[str, str], ...]) -> str:
    return ", ".join(f"'{src}>{dst}'" for src, dst in pairs)


def _postgres_state_guard(*, table: str, name: str, noun: str, pairs: tuple[tuple[str, str], ...]) -> list[str]:
    """The trigger that keeps `table`'s (state, version) on the edges of its state table (PostgreSQL)."""
    return [
        f"""
        CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.state IS DISTINCT FROM OLD.state THEN
                IF NEW.version IS DISTINCT FROM OLD.version + 1 THEN
                    RAISE EXCEPTION '{noun} %: state change % -> % must bump version by one (% -> %)',
                        OLD.id, OLD.state, NEW.state, OLD.version, NEW.version USING ERRCODE = 'check_violation';
                END IF;
                IF NOT (OLD.state || '>' || NEW.state = ANY (ARRAY[{_edge_list(pairs)}])) THEN
                    RAISE EXCEPTION '{noun} %: illegal state change % -> %', OLD.id, OLD.state, NEW.state
                        USING ERRCODE = 'check_violation';
                END IF;
            ELSIF NEW.version IS DISTINCT FROM OLD.version THEN
                RAISE EXCEPTION '{noun} %: version changes only with the state', OLD.id
                    USING ERRCODE = 'check_violation';
            END IF;
            RETURN NEW;
        END $$;
        """,
        f"DROP TRIGGER IF EXISTS {name} ON {table}",
        f"""
        CREATE TRIGGER {name} BEFORE UPDATE OF state, version ON {table}
        FOR EACH ROW EXECUTE FUNCTION {name}()
        """,
    ]


def _sqlite_state_guard(*, table: str, prefix: str, noun: str, pairs: tuple[tuple[str, str], ...]) -> list[str]:
    """The same on SQLite: two triggers, the edge and the version (RAISE(ABORT) is an IntegrityError)."""
    return [
        f"DROP TRIGGER IF EXISTS {prefix}_edge",
        f"""
        CREATE TRIGGER {prefix}_edge BEFORE UPDATE OF state ON {table}
        FOR EACH ROW WHEN NEW.state IS NOT OLD.state AND (OLD.state || '>' || NEW.state) NOT IN ({_edge_list(pairs)})
        BEGIN SELECT RAISE(ABORT, 'illegal {noun} state change: not an edge of the state table'); END
        """,
        f"DROP TRIGGER IF EXISTS {prefix}_version",
        f"""
        CREATE TRIGGER {prefix}_version BEFORE UPDATE OF state, version ON {table}
        FOR EACH ROW WHEN (NEW.state IS NOT OLD.state AND NEW.version IS NOT OLD.version + 1)
                       OR (NEW.state IS OLD.state AND NEW.version IS NOT OLD.version)
        BEGIN SELECT RAISE(ABORT, '{noun} version must rise by exactly one with each state change'); END
        """,
    ]


def _postgres_entry_guard(pairs: tuple[tuple[str, str], ...]) -> list[str]:
    return _postgres_state_guard(
        table="recovery_compensationentry", name="recovery_entry_state_guard", noun="compensation", pairs=pairs
    )


def _sqlite_entry_guard(pairs: tuple[tuple[str, str], ...]) -> list[str]:
    return _sqlite_state_guard(
        table="recovery_compensationentry", prefix="recovery_entry_state", noun="compensation", pairs=pairs
    )


def postgres_sql(pairs: tuple[tuple[str, str], ...] = ALLOWED_PAIRS) -> list[str]:
    return [
        *_postgres_state_guard(table="recovery_call", name="recovery_call_state_guard", noun="call", pairs=pairs),
        f"""
        CREATE OR REPLACE FUNCTION recovery_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF coalesce(current_setting('{SETTING}', true), '') = 'on' THEN
                IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
                RETURN NEW;
            END IF;
            RAISE EXCEPTION '% is append-only: % refused (see recovery.audit.audit_maintenance)',
                TG_TABLE_NAME, TG_OP USING ERRCODE = 'restrict_violation';
        END $$;
        """,
        "DROP TRIGGER IF EXISTS recovery_auditevent_append_only ON recovery_auditevent",
        """
        CREATE TRIGGER recovery_auditevent_append_only BEFORE UPDATE OR DELETE ON recovery_auditevent
        FOR EACH ROW EXECUTE FUNCTION recovery_audit_append_only()
        """,
        f"""
        CREATE OR REPLACE FUNCTION recovery_audit_head_forward_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF coalesce(current_setting('{SETTING}', true), '') = 'on' THEN
                IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
                RETURN NEW;
            END IF;
            IF TG_OP = 'UPDATE' AND NEW.key = OLD.key AND (NEW.length = OLD.length OR (
                NEW.length > OLD.length AND NEW.length <= {_EVENTS_COUNTED}
            )) THEN
                RETURN NEW;
            END IF;
            RAISE EXCEPTION 'audit chain heads only move forward, and never past their events: % refused', TG_OP
                USING ERRCODE = 'restrict_violation';
        END $$;
        """,
        "DROP TRIGGER IF EXISTS recovery_auditchainhead_forward_only ON recovery_auditchainhead",
        """
        CREATE TRIGGER recovery_auditchainhead_forward_only BEFORE UPDATE OR DELETE ON recovery_auditchainhead
        FOR EACH ROW EXECUTE FUNCTION recovery_audit_head_forward_only()
        """,
        "DROP TRIGGER IF EXISTS recovery_auditevent_no_truncate ON recovery_auditevent",
        """
        CREATE TRIGGER recovery_auditevent_no_truncate BEFORE TRUNCATE ON recovery_auditevent
        FOR EACH STATEMENT EXECUTE FUNCTION recovery_audit_append_only()
        """,
    ]


def sqlite_sql(pairs: tuple[tuple[str, str], ...] = ALLOWED_PAIRS) -> list[str]:
    # RAISE(ABORT, ...) reports SQLITE_CONSTRAINT, which Django raises as IntegrityError.
    return [
        *_sqlite_state_guard(table="recovery_call", prefix="recovery_call_state", noun="call", pairs=pairs),
        "DROP TRIGGER IF EXISTS recovery_auditevent_no_update",
        """
        CREATE TRIGGER recovery_auditevent_no_update BEFORE UPDATE ON recovery_auditevent
        FOR EACH ROW WHEN recovery_audit_maintenance() = 0
        BEGIN SELECT RAISE(ABORT, 'recovery_auditevent is append-only: UPDATE refused'); END
        """,
        "DROP TRIGGER IF EXISTS recovery_auditchainhead_forward_only",
        f"""
        CREATE TRIGGER recovery_auditchainhead_forward_only BEFORE UPDATE ON recovery_auditchainhead
        FOR EACH ROW WHEN recovery_audit_maintenance() = 0
            AND (NEW.key IS NOT OLD.key OR NEW.length < OLD.length
                 OR (NEW.length > OLD.length AND NEW.length > {_EVENTS_COUNTED}))
        BEGIN SELECT RAISE(ABORT, 'audit chain heads only move forward, and never past their events'); END
        """,
        "DROP TRIGGER IF EXISTS recovery_auditchainhead_no_delete",
        """
        CREATE TRIGGER recovery_auditchainhead_no_delete BEFORE DELETE ON recovery_auditchainhead
        FOR EACH ROW WHEN recovery_audit_maintenance() = 0
        BEGIN SELECT RAISE(ABORT, 'audit chain heads cannot be deleted'); END
        """,
        "DROP TRIGGER IF EXISTS recovery_auditevent_no_delete",
        """
        CREATE TRIGGER recovery_auditevent_no_delete BEFORE DELETE ON recovery_auditevent
        FOR EACH ROW WHEN recovery_audit_maintenance() = 0
        BEGIN SELECT RAISE(ABORT, 'recovery_auditevent is append-only: DELETE refused'); END
        """,
    ]


def entry_guard_sql(vendor: str, pairs: tuple[tuple[str, str], ...] = ENTRY_PAIRS) -> list[str]:
    """The compensation entries' state guard (docs/compensation.md), generated from
    recovery.engine.compensation_states."""
    if vendor == "postgresql":
        return _postgres_entry_guard(pairs)
    if vendor == "sqlite":
        return _sqlite_entry_guard(pairs)
    raise RuntimeError(f"no database guards for {vendor}: only PostgreSQL and SQLite are supported")


def set_maintenance(connection: BaseDatabaseWrapper, on: bool, *, local: bool) -> None:
    """Flip the switch. Call it only through recovery.audit.chain.audit_maintenance(), which records the use."""
    if connection.vendor == "postgresql":
        if not on and local and _transaction_failed(connection):
            return  # the rollback that must follow resets a SET LOCAL; any SQL now would hide the real error
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config(%s, %s, %s)", [SETTING, "on" if on else "off", local])
    else:
        connection.ensure_connection()
        connection.recovery_audit_maintenance = on


def _transaction_failed(connection: BaseDatabaseWrapper) -> bool:
    from psycopg.pq import TransactionStatus

    return connection.connection is not None and connection.connection.info.transaction_status == (
        TransactionStatus.INERROR
    )


def _register_sqlite_function(sender, connection: BaseDatabaseWrapper, **kwargs) -> None:
    if connection.vendor != "sqlite":
        return
    connection.recovery_audit_maintenance = False
    connection.connection.create_function(
        "recovery_audit_maintenance", 0, lambda: 1 if connection.recovery_audit_maintenance else 0
    )


def connect_signals() -> None:
    connection_created.connect(_register_sqlite_function, dispatch_uid="recovery_sqlite_guard_function")
