# The MCP gateway's registry fields (docs/mcp-gateway.md): an MCP server as a provider, an MCP tool as a tool.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("recovery", "0032_notifications"),
    ]

    operations = [
        migrations.AddField(
            model_name="provider",
            name="mcp",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name="tool",
            name="mcp",
            field=models.JSONField(blank=True, default=dict),
        ),
    ]
