"""The operator console's pages (docs/console.md): plain function views over recovery.selectors and recovery.services,
one module per screen. Every page needs a signed-in user with a role (console.views.common names the permissions)."""
