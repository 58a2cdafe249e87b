from django.apps import AppConfig


class RecoveryConfig(AppConfig):
    name = "recovery"
    verbose_name = "Recovery"

    def ready(self) -> None:
        from recovery import dbguards

        dbguards.connect_signals()
