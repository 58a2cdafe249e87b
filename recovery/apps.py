from django.apps import AppConfig


class RecoveryConfig(AppConfig):
    name = "recovery"
    verbose_name = "Recovery"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from recovery.statemachine import dbguards

        dbguards.connect_signals()
        # The role groups hold exactly the permissions recovery.models.roles gives them after every migrate, and again
        # after a flush (which empties them with every other table): the test suite's transactional tests flush.
        post_migrate.connect(_sync_roles, sender=self, dispatch_uid="recovery.sync_roles")


def _sync_roles(sender, **kwargs) -> None:
    from django.apps import apps

    from recovery.models.roles import sync_roles

    sync_roles(apps)
