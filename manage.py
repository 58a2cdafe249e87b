#!/usr/bin/env python
import os
import sys

HELP = {"help", "--help", "-h"}


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        settings.INSTALLED_APPS  # noqa: B018 - loads the settings, which fail loudly on a missing secret
    except ImproperlyConfigured as error:
        if len(sys.argv) > 1 and not HELP.intersection(sys.argv[1:]):
            sys.exit(
                f"manage.py: ImproperlyConfigured: {error}. Production settings (DEBUG off) need it from the "
                "environment (README.md, Configuration); for development set DEBUG=1 (make run does)."
            )
        # Help reads no secret: the development defaults load the commands to describe them.
        os.environ["DEBUG"] = "1"
    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
