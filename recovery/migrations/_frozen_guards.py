"""The database guards as SQL, frozen: what recovery/statemachine/dbguards.py generated when the migrations stopped
importing it (the call state trigger from the edges of recovery/engine/states.py, the audit table's append-only
triggers, the chain heads' forward-only trigger; the compensation entries' state trigger from
recovery/engine/compensation_states.py), per database vendor, for migrations 0002, 0012-0015, 0017, 0025 and 0027.

History: never edit this module. A later change to the guards, to a state table or to a guarded table is a new
migration with a frozen copy of its own (a new `_frozen_*` module when several migrations share it). Django does not
take a module whose name starts with "_" for a migration.
"""

GUARDS = {
    "postgresql": [
        """
        CREATE OR REPLACE FUNCTION recovery_call_state_guard() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.state IS DISTINCT FROM OLD.state THEN
                IF NEW.version IS DISTINCT FROM OLD.version + 1 THEN
                    RAISE EXCEPTION 'call %: state change % -> % must bump version by one (% -> %)',
                        OLD.id, OLD.state, NEW.state, OLD.version, NEW.version USING ERRCODE = 'check_violation';
                END IF;
                IF NOT (OLD.state || '>' || NEW.state = ANY (ARRAY['ACCEPTED>COMMITTED', 'ACCEPTED>FAILED_PERMANENT', 'ACCEPTED>HUMAN_REVIEW', 'ACCEPTED>UNKNOWN', 'COMMITTED>COMPENSATING', 'COMMITTED>HUMAN_REVIEW', 'COMPENSATED>HUMAN_REVIEW', 'COMPENSATING>COMPENSATED', 'COMPENSATING>COMPENSATION_FAILED', 'COMPENSATING>HUMAN_REVIEW', 'COMPENSATING>PARTIAL_COMPENSATED', 'COMPENSATION_FAILED>COMPENSATING', 'COMPENSATION_FAILED>HUMAN_REVIEW', 'FAILED_PERMANENT>HUMAN_REVIEW', 'HUMAN_REVIEW>COMMITTED', 'HUMAN_REVIEW>FAILED_PERMANENT', 'HUMAN_REVIEW>NOT_COMMITTED', 'HUMAN_REVIEW>RETRYABLE', 'HUMAN_REVIEW>SENT', 'NOT_COMMITTED>FAILED_PERMANENT', 'NOT_COMMITTED>HUMAN_REVIEW', 'NOT_COMMITTED>RETRYABLE', 'PARTIAL_COMPENSATED>COMPENSATING', 'PARTIAL_COMPENSATED>HUMAN_REVIEW', 'READY>FAILED_PERMANENT', 'READY>HUMAN_REVIEW', 'READY>SENT', 'RETRYABLE>FAILED_PERMANENT', 'RETRYABLE>HUMAN_REVIEW', 'RETRYABLE>SENT', 'SENT>ACCEPTED', 'SENT>COMMITTED', 'SENT>FAILED_PERMANENT', 'SENT>HUMAN_REVIEW', 'SENT>RETRYABLE', 'SENT>UNKNOWN', 'STILL_UNKNOWN>COMMITTED', 'STILL_UNKNOWN>HUMAN_REVIEW', 'STILL_UNKNOWN>NOT_COMMITTED', 'STILL_UNKNOWN>SENT', 'UNKNOWN>COMMITTED', 'UNKNOWN>HUMAN_REVIEW', 'UNKNOWN>NOT_COMMITTED', 'UNKNOWN>SENT', 'UNKNOWN>STILL_UNKNOWN'])) THEN
                    RAISE EXCEPTION 'call %: illegal state change % -> %', OLD.id, OLD.state, NEW.state
                        USING ERRCODE = 'check_violation';
                END IF;
            ELSIF NEW.version IS DISTINCT FROM OLD.version THEN
                RAISE EXCEPTION 'call %: version changes only with the state', OLD.id
                    USING ERRCODE = 'check_violation';
            END IF;
            RETURN NEW;
        END $$;
        """,
        "DROP TRIGGER IF EXISTS recovery_call_state_guard ON recovery_call",
        """
        CREATE TRIGGER recovery_call_state_guard BEFORE UPDATE OF state, version ON recovery_call
        FOR EACH ROW EXECUTE FUNCTION recovery_call_state_guard()
        """,
        """
        CREATE OR REPLACE FUNCTION recovery_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF coalesce(current_setting('recovery.audit_maintenance', true), '') = 'on' THEN
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
        """
        CREATE OR REPLACE FUNCTION recovery_audit_head_forward_only() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF coalesce(current_setting('recovery.audit_maintenance', true), '') = 'on' THEN
                IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
                RETURN NEW;
            END IF;
            IF TG_OP = 'UPDATE' AND NEW.key = OLD.key AND (NEW.length = OLD.length OR (
                NEW.length > OLD.length AND NEW.length <= (CASE WHEN NEW.key = 'global' THEN (SELECT coalesce(max(seq), 0) FROM recovery_auditevent) ELSE (SELECT coalesce(max(chain_seq), 0) FROM recovery_auditevent WHERE chain = NEW.key) END)
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
    ],
    "sqlite": [
        "DROP TRIGGER IF EXISTS recovery_call_state_edge",
        """
        CREATE TRIGGER recovery_call_state_edge BEFORE UPDATE OF state ON recovery_call
        FOR EACH ROW WHEN NEW.state IS NOT OLD.state AND (OLD.state || '>' || NEW.state) NOT IN ('ACCEPTED>COMMITTED', 'ACCEPTED>FAILED_PERMANENT', 'ACCEPTED>HUMAN_REVIEW', 'ACCEPTED>UNKNOWN', 'COMMITTED>COMPENSATING', 'COMMITTED>HUMAN_REVIEW', 'COMPENSATED>HUMAN_REVIEW', 'COMPENSATING>COMPENSATED', 'COMPENSATING>COMPENSATION_FAILED', 'COMPENSATING>HUMAN_REVIEW', 'COMPENSATING>PARTIAL_COMPENSATED', 'COMPENSATION_FAILED>COMPENSATING', 'COMPENSATION_FAILED>HUMAN_REVIEW', 'FAILED_PERMANENT>HUMAN_REVIEW', 'HUMAN_REVIEW>COMMITTED', 'HUMAN_REVIEW>FAILED_PERMANENT', 'HUMAN_REVIEW>NOT_COMMITTED', 'HUMAN_REVIEW>RETRYABLE', 'HUMAN_REVIEW>SENT', 'NOT_COMMITTED>FAILED_PERMANENT', 'NOT_COMMITTED>HUMAN_REVIEW', 'NOT_COMMITTED>RETRYABLE', 'PARTIAL_COMPENSATED>COMPENSATING', 'PARTIAL_COMPENSATED>HUMAN_REVIEW', 'READY>FAILED_PERMANENT', 'READY>HUMAN_REVIEW', 'READY>SENT', 'RETRYABLE>FAILED_PERMANENT', 'RETRYABLE>HUMAN_REVIEW', 'RETRYABLE>SENT', 'SENT>ACCEPTED', 'SENT>COMMITTED', 'SENT>FAILED_PERMANENT', 'SENT>HUMAN_REVIEW', 'SENT>RETRYABLE', 'SENT>UNKNOWN', 'STILL_UNKNOWN>COMMITTED', 'STILL_UNKNOWN>HUMAN_REVIEW', 'STILL_UNKNOWN>NOT_COMMITTED', 'STILL_UNKNOWN>SENT', 'UNKNOWN>COMMITTED', 'UNKNOWN>HUMAN_REVIEW', 'UNKNOWN>NOT_COMMITTED', 'UNKNOWN>SENT', 'UNKNOWN>STILL_UNKNOWN')
        BEGIN SELECT RAISE(ABORT, 'illegal call state change: not an edge of the state table'); END
        """,
        "DROP TRIGGER IF EXISTS recovery_call_state_version",
        """
        CREATE TRIGGER recovery_call_state_version BEFORE UPDATE OF state, version ON recovery_call
        FOR EACH ROW WHEN (NEW.state IS NOT OLD.state AND NEW.version IS NOT OLD.version + 1)
                       OR (NEW.state IS OLD.state AND NEW.version IS NOT OLD.version)
        BEGIN SELECT RAISE(ABORT, 'call version must rise by exactly one with each state change'); END
        """,
        "DROP TRIGGER IF EXISTS recovery_auditevent_no_update",
        """
        CREATE TRIGGER recovery_auditevent_no_update BEFORE UPDATE ON recovery_auditevent
        FOR EACH ROW WHEN recovery_audit_maintenance() = 0
        BEGIN SELECT RAISE(ABORT, 'recovery_auditevent is append-only: UPDATE refused'); END
        """,
        "DROP TRIGGER IF EXISTS recovery_auditchainhead_forward_only",
        """
        CREATE TRIGGER recovery_auditchainhead_forward_only BEFORE UPDATE ON recovery_auditchainhead
        FOR EACH ROW WHEN recovery_audit_maintenance() = 0
            AND (NEW.key IS NOT OLD.key OR NEW.length < OLD.length
                 OR (NEW.length > OLD.length AND NEW.length > (CASE WHEN NEW.key = 'global' THEN (SELECT coalesce(max(seq), 0) FROM recovery_auditevent) ELSE (SELECT coalesce(max(chain_seq), 0) FROM recovery_auditevent WHERE chain = NEW.key) END)))
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
    ],
}

ENTRY_GUARD = {
    "postgresql": [
        """
        CREATE OR REPLACE FUNCTION recovery_entry_state_guard() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.state IS DISTINCT FROM OLD.state THEN
                IF NEW.version IS DISTINCT FROM OLD.version + 1 THEN
                    RAISE EXCEPTION 'compensation %: state change % -> % must bump version by one (% -> %)',
                        OLD.id, OLD.state, NEW.state, OLD.version, NEW.version USING ERRCODE = 'check_violation';
                END IF;
                IF NOT (OLD.state || '>' || NEW.state = ANY (ARRAY['not_committed>failed', 'not_committed>sent', 'pending>failed', 'pending>sent', 'review>committed', 'review>failed', 'sent>committed', 'sent>failed', 'sent>not_committed', 'sent>review', 'sent>unknown', 'unknown>committed', 'unknown>failed', 'unknown>not_committed', 'unknown>review'])) THEN
                    RAISE EXCEPTION 'compensation %: illegal state change % -> %', OLD.id, OLD.state, NEW.state
                        USING ERRCODE = 'check_violation';
                END IF;
            ELSIF NEW.version IS DISTINCT FROM OLD.version THEN
                RAISE EXCEPTION 'compensation %: version changes only with the state', OLD.id
                    USING ERRCODE = 'check_violation';
            END IF;
            RETURN NEW;
        END $$;
        """,
        "DROP TRIGGER IF EXISTS recovery_entry_state_guard ON recovery_compensationentry",
        """
        CREATE TRIGGER recovery_entry_state_guard BEFORE UPDATE OF state, version ON recovery_compensationentry
        FOR EACH ROW EXECUTE FUNCTION recovery_entry_state_guard()
        """,
    ],
    "sqlite": [
        "DROP TRIGGER IF EXISTS recovery_entry_state_edge",
        """
        CREATE TRIGGER recovery_entry_state_edge BEFORE UPDATE OF state ON recovery_compensationentry
        FOR EACH ROW WHEN NEW.state IS NOT OLD.state AND (OLD.state || '>' || NEW.state) NOT IN ('not_committed>failed', 'not_committed>sent', 'pending>failed', 'pending>sent', 'review>committed', 'review>failed', 'sent>committed', 'sent>failed', 'sent>not_committed', 'sent>review', 'sent>unknown', 'unknown>committed', 'unknown>failed', 'unknown>not_committed', 'unknown>review')
        BEGIN SELECT RAISE(ABORT, 'illegal compensation state change: not an edge of the state table'); END
        """,
        "DROP TRIGGER IF EXISTS recovery_entry_state_version",
        """
        CREATE TRIGGER recovery_entry_state_version BEFORE UPDATE OF state, version ON recovery_compensationentry
        FOR EACH ROW WHEN (NEW.state IS NOT OLD.state AND NEW.version IS NOT OLD.version + 1)
                       OR (NEW.state IS OLD.state AND NEW.version IS NOT OLD.version)
        BEGIN SELECT RAISE(ABORT, 'compensation version must rise by exactly one with each state change'); END
        """,
    ],
}


def install(apps, schema_editor):
    """Install (or replace) every guard on the migration's connection."""
    vendor = schema_editor.connection.vendor
    if vendor not in GUARDS:
        raise RuntimeError(f"no database guards for {vendor}: only PostgreSQL and SQLite are supported")
    for statement in GUARDS[vendor]:
        schema_editor.execute(statement, params=None)  # None: '%' in PL/pgSQL is not a placeholder


def uninstall(apps, schema_editor):
    """Drop SQLite's guards before a table rebuild (install them again after it): SQLite rebuilds a table by renaming
    a copy into its place, which fails while another table's trigger names it. Nothing to do on PostgreSQL."""
    if schema_editor.connection.vendor != "sqlite":
        return
    for statement in GUARDS["sqlite"]:
        if statement.startswith("DROP TRIGGER"):
            schema_editor.execute(statement, params=None)


def install_entry_guard(apps, schema_editor):
    """Install (or replace) the entries' state guard on the migration's connection."""
    vendor = schema_editor.connection.vendor
    if vendor not in ENTRY_GUARD:
        raise RuntimeError(f"no database guards for {vendor}: only PostgreSQL and SQLite are supported")
    for statement in ENTRY_GUARD[vendor]:
        schema_editor.execute(statement, params=None)  # None: '%' in PL/pgSQL is not a placeholder
