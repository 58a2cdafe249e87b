from django.core.management.base import BaseCommand, CommandError

from recovery.audit import verify_all, verify_chain


class Command(BaseCommand):
    help = (
        "Verify the audit trail: every chain's hash links, its head, and the gap-free global sequence. "
        "Prints the first broken link, gap or missing tail and exits non-zero."
    )

    def add_arguments(self, parser):
        parser.add_argument("--chain", help="verify one chain only, e.g. task:42 or system")

    def handle(self, *args, chain=None, **options):
        report = verify_chain(chain) if chain else verify_all()
        if not report.ok:
            raise CommandError(f"audit trail BROKEN: {report.problem} ({report.events} events read)")
        self.stdout.write(f"audit trail OK: {report.events} events in {report.chains} chains verified")
