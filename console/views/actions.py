"""(being built: operator actions — preview, request, approve, reject, the approvals queue)"""

from __future__ import annotations

urlpatterns: list = []
