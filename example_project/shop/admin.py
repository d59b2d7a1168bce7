from django.contrib import admin

from ..admin_links import workflow_runs_link
from .models import CarrierBooking, Order, Payment


class PaymentInline(admin.TabularInline):
    model = Payment
    extra = 0
    fields = ("reference", "amount_cents", "received_at")
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ("number", "customer_email", "total_cents", "postcode", "status", "tracking_number", "runs")
    list_filter = ("status",)
    search_fields = ("number", "customer_email")
    readonly_fields = ("status", "tracking_number", "runs")
    inlines = (PaymentInline,)

    @admin.display(description="workflow")
    def runs(self, obj: Order) -> str:
        return workflow_runs_link(obj)


@admin.register(Payment)
class PaymentAdmin(admin.ModelAdmin):
    list_display = ("reference", "order", "amount_cents", "received_at")
    search_fields = ("reference", "order__number")


@admin.register(CarrierBooking)
class CarrierBookingAdmin(admin.ModelAdmin):
    list_display = ("idempotency_key", "order", "calls", "tracking_number")
    search_fields = ("idempotency_key", "order__number", "tracking_number")
