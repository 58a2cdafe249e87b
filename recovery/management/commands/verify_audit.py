from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from recovery.audit.chain import verify_all, verify_chain
from recovery.audit.checkpoints import verify_checkpoints


class Command(BaseCommand):
    help = (
        "Verify the audit trail: every chain's hash links and keyed HMACs, its head, and the gap-free global "
        "sequence; with --checkpoints, also that the database still holds every head the signed checkpoints "
        "recorded (a removed tail or a rewritten chain). Prints the first problem and exits non-zero."
    )

    def add_arguments(self, parser):
        parser.add_argument("--chain", help="verify one chain only, e.g. task:42 or system")
        parser.add_argument(
            "--checkpoints",
            nargs="?",
            const=str(settings.RECOVERY_AUDIT_CHECKPOINT_DIR),
            metavar="DIR",
            help="check against the checkpoints in DIR (default RECOVERY_AUDIT_CHECKPOINT_DIR)",
        )

    def handle(self, *args, chain=None, checkpoints=None, **options):
        report = verify_chain(chain) if chain else verify_all()
        if not report.ok:
            raise CommandError(f"audit trail BROKEN: {report.problem} ({report.events} events read)")
        unkeyed = f"; {report.unkeyed} written before the audit keys existed (unkeyed)" if report.unkeyed else ""
        self.stdout.write(f"audit trail OK: {report.events} events in {report.chains} chains verified{unkeyed}")
        if checkpoints is None:
            return
        anchored = verify_checkpoints(Path(checkpoints))
        if not anchored.ok:
            raise CommandError(f"audit trail BROKEN against the checkpoints: {anchored.problem}")
        self.stdout.write(
            f"checkpoints OK: {anchored.checkpoints} checkpoints, {anchored.chains} chain heads found as recorded; "
            f"events after #{anchored.covered_seq} are newer than the last checkpoint (not yet anchored)"
        )
