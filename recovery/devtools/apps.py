from django.apps import AppConfig


class DevtoolsConfig(AppConfig):
    """The tooling's management commands (run, demo_agent, drill, nodes, bench, runsandbox); it has no models."""

    name = "recovery.devtools"
    label = "devtools"
    verbose_name = "Recovery tooling"
