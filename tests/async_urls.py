"""An async view that starts and signals runs with the async API, as docs/starting.md shows."""

import json

from django.http import HttpRequest, JsonResponse
from django.urls import path

from tests.testapp.models import Order
from tests.testapp.workflows import Approval


async def approve(request: HttpRequest, order_id: int) -> JsonResponse:
    """Start the order's approval run (or find it by its idempotency key), then deliver the approval."""
    order = await Order.objects.aget(pk=order_id)
    wf = await Approval.astart(order, idempotency_key=f"approval-{order_id}")
    signal = await wf.asignal("approved", json.loads(request.body))
    return JsonResponse({"workflow_id": str(wf.workflow_id), "signal": signal.pk, "duplicate": wf.duplicate_start})


urlpatterns = [path("orders/<int:order_id>/approve/", approve)]
