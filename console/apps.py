from django.apps import AppConfig


class ConsoleConfig(AppConfig):
    name = "console"
    verbose_name = "Operator console"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_in

        user_logged_in.connect(_note_saved_views, dispatch_uid="console.saved_views")


def _note_saved_views(sender, request, user, **kwargs) -> None:
    """A new session notes how many views its user saved, so the navigation reads them only when there are some
    (console/views/common.py nav_counts)."""
    from console.views.common import SAVED_VIEWS_KEY
    from recovery.models import SavedView

    if request is not None:
        request.session[SAVED_VIEWS_KEY] = SavedView.objects.filter(user=user).count()
