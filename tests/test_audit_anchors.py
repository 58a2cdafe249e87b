"""The audit trail against someone with full database access (docs/design/audit.md): HMACs under a key kept outside the
database, and signed checkpoints of the heads written outside it.

Before these, two rewrites by a database superuser with the triggers off left verify_audit reporting OK: removing
the newest event and rewinding its chain head and the global head, and editing a middle event and recomputing the
rest of its chain's hashes and the head. The tampering here is done that way — `session_replication_role =
replica` (no triggers, no foreign keys) as PostgreSQL's superuser; on SQLite, with the triggers dropped — on events
older than the last checkpoint."""

from __future__ import annotations

import io
import json

import pytest
from django.core.management import CommandError, call_command

from recovery.audit.chain import GLOBAL, Keyring, audit_purge_chains, event_hash, verify_all
from recovery.audit.checkpoints import CheckpointRefused, checkpoint_write, trail_directory, verify_checkpoints
from recovery.models import AuditChainHead, AuditEvent, Task
from tests.test_audit import HASHED_FIELDS, ROBOT, append, guards_disabled, raw

K1 = ("k1", "first-audit-key-" + "a" * 32)
K2 = ("k2", "second-audit-key-" + "b" * 32)


@pytest.fixture
def other_task(registry):
    return Task.objects.create(tenant=registry["tenant"], external_id="other-task", agent="demo", goal="g")


@pytest.fixture
def trail(task, other_task, tmp_path):
    """A1 B1 A2 A3 B2 A4 (global seq 1..6), verified good, and a checkpoint that covers them all."""
    events = {}
    for name, owner in [("A1", task), ("B1", other_task), ("A2", task), ("A3", task), ("B2", other_task), ("A4", task)]:
        (events[name],) = append(owner)
    assert verify_all().ok
    events["checkpoints"] = tmp_path / "checkpoints"
    assert checkpoint_write(events["checkpoints"]) is not None
    assert verify_checkpoints(events["checkpoints"]).ok
    return events


def _rewind(chain: str, to: AuditEvent) -> None:
    raw(
        "UPDATE recovery_auditchainhead SET length = %s, head_hash = %s, head_event_id = %s WHERE key = %s",
        [to.chain_seq if chain != GLOBAL else to.seq, to.hash, to.pk, chain],
    )


def test_a_removed_tail_with_its_heads_rewound_is_caught_by_the_checkpoint(trail, task):
    a3, b2 = trail["A3"], trail["B2"]
    with guards_disabled():
        raw("DELETE FROM recovery_auditevent WHERE id = %s", [trail["A4"].pk])
        _rewind(f"task:{task.pk}", a3)
        _rewind(GLOBAL, b2)
        assert verify_all().ok  # every event left is linked, hashed and signed: the database alone cannot tell
        anchored = verify_checkpoints(trail["checkpoints"])
    assert not anchored.ok
    assert anchored.problem.startswith(
        f"chain task:{task.pk}: event #4, its head in checkpoint checkpoint-000000000006"
    )
    assert anchored.problem.endswith("is missing: the tail was removed")


def _rehash_chain_from(events: list[AuditEvent], *, keyring: Keyring | None, reason: str) -> AuditEvent:
    """Edit the first event's reason and recompute the hashes (and links) of it and every later event of its
    chain, as a tamperer who knows the hashing scheme would; re-sign them if `keyring` (a leaked key) is given."""
    prev_hash = events[0].prev_hash
    for number, event in enumerate(events):
        fields = {field: getattr(event, field) for field in HASHED_FIELDS} | {"prev_hash": prev_hash}
        if number == 0:
            fields["reason"] = reason
        digest = event_hash(**fields)
        mac = keyring.sign(digest) if keyring else event.hmac
        raw(
            "UPDATE recovery_auditevent SET reason = %s, prev_hash = %s, hash = %s, hmac = %s WHERE id = %s",
            [fields["reason"], prev_hash, digest, mac, event.pk],
        )
        prev_hash = digest
    return AuditEvent.objects.get(pk=events[-1].pk)


def test_no_checkpoint_is_written_over_a_trail_that_lost_what_the_last_one_recorded(trail, task, caplog):
    # A checkpoint written after the tampering would record the rewound heads as the truth.
    with guards_disabled():
        raw("DELETE FROM recovery_auditevent WHERE id = %s", [trail["A4"].pk])
        _rewind(f"task:{task.pk}", trail["A3"])
        _rewind(GLOBAL, trail["B2"])
        with pytest.raises(CheckpointRefused, match="the global head is at #5, behind #6 that checkpoint"):
            checkpoint_write(trail["checkpoints"])
    assert len(list(trail["checkpoints"].glob("checkpoint-*.json"))) == 1


def test_checkpoints_go_to_a_folder_of_their_database_and_verify_finds_it_from_the_root(task, settings, tmp_path):
    settings.RECOVERY_AUDIT_CHECKPOINT_DIR = tmp_path
    append(task, 2)
    written = checkpoint_write()
    assert written.parent == trail_directory(tmp_path) and written.parent.parent == tmp_path
    assert verify_checkpoints(tmp_path).ok and verify_checkpoints(tmp_path).checkpoints == 1


@pytest.mark.parametrize("key", ["unknown", "leaked"])
def test_a_middle_event_rewritten_with_the_rest_of_its_chain_rehashed_is_caught(trail, task, key):
    chain = f"task:{task.pk}"
    rewritten = [trail["A2"], trail["A3"], trail["A4"]]
    with guards_disabled():
        last = _rehash_chain_from(rewritten, keyring=Keyring.from_settings() if key == "leaked" else None, reason="-")
        _rewind(chain, last)
        _rewind(GLOBAL, last)  # A4 is also the last event of the global sequence
        report, anchored = verify_all(), verify_checkpoints(trail["checkpoints"])
    if key == "unknown":  # without the audit key the HMACs give it away, checkpoint or not
        assert report.problem == (
            f"chain {chain} event #2 (seq 3) does not match its HMAC (key 'dev'): rewritten by someone without the "
            "audit key"
        )
    else:  # even holding the key, the chain no longer ends where the checkpoint says
        assert report.ok
    assert anchored.problem.startswith(f"chain {chain}: event #4 is not the one checkpoint checkpoint-000000000006")
    assert anchored.problem.endswith("recorded: the chain was rewritten")


def test_stripping_the_hmacs_is_caught_with_or_without_a_checkpoint(trail, task):
    with guards_disabled():
        raw("UPDATE recovery_auditevent SET hmac = '', key_id = '' WHERE id = %s", [trail["A3"].pk])
        assert verify_all().problem == "event #4 carries no HMAC although event #1 before it does: stripped"
        raw("UPDATE recovery_auditevent SET hmac = '', key_id = ''")  # every one: the trail looks older than keys
        assert verify_all().ok and verify_all().unkeyed == 6
        anchored = verify_checkpoints(trail["checkpoints"])
    assert anchored.problem == "event #1 carries no HMAC although keys signed every event from #1 on: stripped"


def test_events_from_before_the_keys_are_reported_unkeyed_not_broken(task, other_task, tmp_path):
    append(task, 2)
    with guards_disabled():  # what a trail written before this release looks like
        raw("UPDATE recovery_auditevent SET hmac = '', key_id = ''")
        report = verify_all()
        assert (report.ok, report.unkeyed, report.events) == (True, 2, 2)
        out = io.StringIO()
        call_command("verify_audit", stdout=out)
        assert (
            "audit trail OK: 2 events in 1 chains verified; 2 written before the audit keys existed" in out.getvalue()
        )
        append(other_task, 2)  # the keys exist from here on
        assert verify_all().unkeyed == 2 and verify_all().ok
        assert checkpoint_write(tmp_path) is not None and verify_checkpoints(tmp_path).ok


def test_rotation_signs_with_the_new_key_and_verifies_with_the_old_one(task, settings, tmp_path):
    settings.RECOVERY_AUDIT_KEYS = [K1]
    append(task, 2)
    checkpoint_write(tmp_path)
    settings.RECOVERY_AUDIT_KEYS = [K2, K1]  # rotated: k2 signs from now on, k1 stays to verify
    append(task, 2)
    assert list(AuditEvent.objects.order_by("seq").values_list("key_id", flat=True)) == ["k1", "k1", "k2", "k2"]
    assert checkpoint_write(tmp_path) is not None
    signers = [json.loads(p.read_text())["key_id"] for p in sorted(tmp_path.glob("checkpoint-*.json"))]
    assert signers == ["k1", "k2"]
    assert verify_all().ok and verify_checkpoints(tmp_path).ok

    settings.RECOVERY_AUDIT_KEYS = [K2]  # k1 dropped: what it signed can no longer be verified
    assert verify_all().problem == (
        f"chain task:{task.pk} event #1 (seq 1) is signed with audit key 'k1', which RECOVERY_AUDIT_KEYS does not hold"
    )
    assert "signed with audit key 'k1'" in verify_checkpoints(tmp_path).problem


def test_a_chain_removed_by_a_recorded_retention_purge_is_not_a_finding(trail, other_task):
    audit_purge_chains(chains=[f"task:{other_task.pk}"], reason="retention: settled 400 days ago", actor=ROBOT)
    assert verify_all().ok
    assert verify_checkpoints(trail["checkpoints"]).ok
    checkpoint_write(trail["checkpoints"])  # the purge's own record moved the system chain
    assert verify_checkpoints(trail["checkpoints"]).ok


def test_an_altered_or_missing_checkpoint_file_is_a_finding(trail, task):
    directory = trail["checkpoints"]
    append(task)
    second = checkpoint_write(directory)
    append(task)
    third = checkpoint_write(directory)
    assert verify_checkpoints(directory).checkpoints == 3

    document = json.loads(second.read_text())
    document["body"]["chains"][f"task:{task.pk}"][0] = 4  # pretend the chain was shorter
    second.write_text(json.dumps(document))
    assert verify_checkpoints(directory).problem == (
        f"checkpoint {second.name} does not match its signature: the file was altered"
    )
    second.unlink()
    assert verify_checkpoints(directory).problem == (
        f"checkpoint {third.name} does not follow checkpoint-000000000006-"
        + sorted(directory.glob("checkpoint-000000000006-*.json"))[0].name.split("-", 2)[2]
        + ": a checkpoint file was removed or altered"
    )


def test_a_checkpoint_records_only_the_chains_that_moved_and_nothing_when_nothing_did(trail, task, other_task):
    directory = trail["checkpoints"]
    first = json.loads(sorted(directory.glob("*.json"))[0].read_text())["body"]
    assert set(first["chains"]) == {f"task:{task.pk}", f"task:{other_task.pk}"}
    assert first["global"] == [6, trail["A4"].hash]
    assert checkpoint_write(directory) is None  # nothing appended since
    (moved,) = append(other_task)
    body = json.loads(checkpoint_write(directory).read_text())["body"]
    assert body["chains"] == {f"task:{other_task.pk}": [3, moved.hash]} and body["global"] == [7, moved.hash]
    head = AuditChainHead.objects.get(key=f"task:{other_task.pk}")
    assert (head.length, head.head_hash) == (3, moved.hash)


def test_verify_audit_checks_the_checkpoints_when_asked(trail, task):
    out = io.StringIO()
    call_command("verify_audit", "--checkpoints", str(trail["checkpoints"]), stdout=out)
    assert "checkpoints OK: 1 checkpoints, 2 chain heads found as recorded; events after #6 are newer" in out.getvalue()
    with guards_disabled():
        raw("DELETE FROM recovery_auditevent WHERE id = %s", [trail["A4"].pk])
        _rewind(f"task:{task.pk}", trail["A3"])
        _rewind(GLOBAL, trail["B2"])
        call_command("verify_audit", stdout=io.StringIO())  # the trail alone still looks whole
        with pytest.raises(CommandError, match=r"BROKEN against the checkpoints: chain task:.*the tail was removed"):
            call_command("verify_audit", "--checkpoints", str(trail["checkpoints"]), stdout=io.StringIO())
