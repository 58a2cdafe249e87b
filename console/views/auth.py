"""Signing in to the console (the Django admin's door shares its throttle: console/forms.py)."""

from __future__ import annotations

from django.contrib.auth import views as auth_views

from console.forms import ThrottledSignInForm


class SignInView(auth_views.LoginView):
    form_class = ThrottledSignInForm
    template_name = "registration/sign_in.html"
    redirect_authenticated_user = True
