"""Forms of the operator console: the queue filters (read from the URL) and sign-in with throttling."""

from __future__ import annotations

from datetime import datetime, timedelta

from django import forms
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.utils import timezone
from django.utils.html import format_html_join

from console.models import SignInFailure
from recovery.models import Risk
from recovery.selectors.queues import AGES, Queue, QueueFilters

AGE_CHOICES = [
    ("", "any age"),
    ("5m", "older than 5 minutes"),
    ("1h", "older than 1 hour"),
    ("24h", "older than 1 day"),
]
SORT_CHOICES = [("oldest", "oldest first"), ("newest", "newest first"), ("due", "due first")]
ASSIGNED_CHOICES = [("", "anyone or nobody"), ("me", "assigned to me"), ("none", "unassigned")]


class QueueFilterForm(forms.Form):
    """The filters of a queue page. Every field is optional and lives in the URL, so a filtered queue can be shared
    and survives the live refresh; a bad value is a field error, never a 500."""

    state = forms.ChoiceField(required=False)
    tool = forms.ChoiceField(required=False)
    tenant = forms.ChoiceField(required=False)
    risk = forms.ChoiceField(required=False, choices=[("", "any risk"), *Risk.choices])
    age = forms.ChoiceField(required=False, choices=AGE_CHOICES)
    q = forms.CharField(required=False, max_length=255, strip=True, label="Search")
    sort = forms.ChoiceField(required=False, choices=SORT_CHOICES)
    assigned = forms.ChoiceField(required=False, choices=ASSIGNED_CHOICES, label="Assigned")
    after = forms.CharField(required=False, max_length=100, widget=forms.HiddenInput)

    def __init__(
        self, data, *, queue: Queue, tools: list[tuple[int, str]], tenants: list[tuple[int, str]], user_id: int | None
    ):
        super().__init__(data)
        self.queue, self.user_id = queue, user_id
        self.fields["state"].choices = [("", "every state here")] + [(state, state) for state in queue.states]
        self.fields["tool"].choices = [("", "every tool"), *((str(pk), name) for pk, name in tools)]
        self.fields["tenant"].choices = [("", "every tenant"), *((str(pk), name) for pk, name in tenants)]

    def controls(self) -> list[dict]:
        """The visible filters as the page draws them, each select's options already HTML (escaped by format_html):
        the tool and tenant lists run to dozens of options, redrawn for every page a reviewer opens."""
        drawn = []
        for field in self.visible_fields():
            current = str(self.data.get(field.name, ""))
            options = ""
            if isinstance(field.field, forms.ChoiceField):
                choices = field.field.choices
                marked = ((value, " selected" if str(value) == current else "", text) for value, text in choices)
                options = format_html_join("", '<option value="{}"{}>{}</option>', marked)
            drawn.append(
                {
                    "name": field.name,
                    "id": field.auto_id,
                    "label": field.label,
                    "errors": field.errors,
                    "options": options,
                    "value": current,
                }
            )
        return drawn

    def clean_after(self) -> tuple[datetime, int] | None:
        raw = self.cleaned_data.get("after") or ""
        if not raw:
            return None
        at, _, pk = raw.rpartition("~")
        try:
            parsed = datetime.fromisoformat(at)
            if parsed.tzinfo is None or not pk.isdigit():
                raise ValueError
        except ValueError:
            raise forms.ValidationError("Not a page position this console made; start from the first page.") from None
        return parsed, int(pk)

    def filters(self) -> QueueFilters:
        data = self.cleaned_data
        states = (data["state"],) if data.get("state") else self.queue.states
        return QueueFilters(
            states=states,
            tool_id=int(data["tool"]) if data.get("tool") else None,
            tenant_id=int(data["tenant"]) if data.get("tenant") else None,
            risk=data.get("risk") or "",
            older_than=AGES.get(data.get("age") or ""),
            q=data.get("q") or "",
            newest_first=data.get("sort") == "newest",
            due_first=data.get("sort") == "due",
            after=data.get("after"),
            compensation=self.queue.compensation,
            assignee_id=self.user_id if data.get("assigned") == "me" else None,
            unassigned=data.get("assigned") == "none",
        )


def cursor_param(cursor: tuple[datetime, int]) -> str:
    at, pk = cursor
    return f"{at.isoformat()}~{pk}"


class ThrottleMixin:
    """Refuse a sign-in outright while its username or address has too many recent failures; record each failure."""

    error_messages = {
        **AuthenticationForm.error_messages,
        "throttled": "Too many failed sign-ins for this account or from this address. Try again in %(minutes)d "
        "minutes, or ask an admin to reset your password.",
    }

    def clean(self):
        username = (self.data.get("username") or "").strip()[:150]
        address = _address(self.request)
        window = timedelta(seconds=settings.RECOVERY_SIGN_IN_WINDOW_S)
        since = timezone.now() - window
        limit = settings.RECOVERY_SIGN_IN_MAX_FAILURES
        recent = SignInFailure.objects.filter(at__gte=since)
        too_many_for_user = bool(username) and recent.filter(username=username).count() >= limit
        too_many_from_address = bool(address) and recent.filter(address=address).count() >= limit * 4
        if too_many_for_user or too_many_from_address:
            raise forms.ValidationError(
                self.error_messages["throttled"],
                code="throttled",
                params={"minutes": max(1, round(window.total_seconds() / 60))},
            )
        try:
            return super().clean()
        except forms.ValidationError:
            SignInFailure.objects.create(username=username, address=address)
            raise


class ThrottledSignInForm(ThrottleMixin, AuthenticationForm):
    """The console's sign-in. Drawn again after a refusal with the username kept, it focuses the password: what a
    person types again."""

    def full_clean(self) -> None:
        super().full_clean()
        if self.is_bound and self.errors and self.data.get("username"):
            self.fields["username"].widget.attrs.pop("autofocus", None)
            self.fields["password"].widget.attrs["autofocus"] = True


class ThrottledAdminSignInForm(ThrottleMixin, AdminAuthenticationForm):
    """The Django admin's sign-in, counted against the same failures (one lockout for both doors)."""

    error_messages = {**ThrottleMixin.error_messages, **AdminAuthenticationForm.error_messages}


def _address(request) -> str | None:
    return request.META.get("REMOTE_ADDR") or None if request is not None else None
