"""Where a call through the MCP gateway came from (docs/mcp-gateway.md, "The console's view"): the server and its
own tool name, the client's name and version from the initialize handshake, how the gateway chose the task, the exact
`tools/call` it sent upstream, and how many re-issues of the call it absorbed."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from recovery.models.calls import Call
from recovery.models.registry import Tenant


class IdentitySource(models.TextChoices):
    """How the gateway chose the call's task (docs/mcp-gateway.md, "The task"), in the order it looks."""

    META = "meta", "named in _meta"
    TRACEPARENT = "traceparent", "the W3C traceparent's trace"
    SESSION = "session", "the legacy MCP session"
    PAIR = "pair", "the (token, client name) pair"


class McpCall(models.Model):
    call = models.OneToOneField(Call, on_delete=models.PROTECT, primary_key=True, related_name="mcp_origin")
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    server = models.CharField(max_length=100)  # the provider's name
    tool = models.CharField(max_length=200)  # the server's own name of the tool
    client_name = models.CharField(max_length=200, blank=True)  # clientInfo.name of the initialize handshake
    client_version = models.CharField(max_length=100, blank=True)  # clientInfo.version
    identity_source = models.CharField(max_length=16, choices=IdentitySource.choices)
    session_id = models.CharField(max_length=100, blank=True)  # Mcp-Session-Id, a legacy client's
    request = models.JSONField(default=dict)  # {server, tool, arguments, _meta}: the tools/call sent upstream
    reissues_absorbed = models.PositiveIntegerField(default=0)
    last_reissue_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        indexes = [models.Index(fields=["tenant", "created_at"], name="mcpcall_tenant_created_idx")]

    def __str__(self) -> str:
        return f"MCP {self.server}/{self.tool} for call {self.call_id}"
