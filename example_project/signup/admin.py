from django.contrib import admin

from ..admin_links import workflow_runs_link
from .models import DripEmail, Signup


class DripEmailInline(admin.TabularInline):
    model = DripEmail
    extra = 0
    fields = ("kind", "subject", "sent_at")
    readonly_fields = fields
    can_delete = False

    def has_add_permission(self, request, obj=None):  # type: ignore[no-untyped-def]
        return False


@admin.register(Signup)
class SignupAdmin(admin.ModelAdmin):
    list_display = ("email", "name", "plan", "marketing_opt_in", "unsubscribed", "created_at", "runs")
    list_filter = ("plan", "marketing_opt_in", "unsubscribed")
    search_fields = ("email", "name")
    readonly_fields = ("runs",)
    inlines = (DripEmailInline,)

    @admin.display(description="workflow")
    def runs(self, obj: Signup) -> str:
        return workflow_runs_link(obj)


@admin.register(DripEmail)
class DripEmailAdmin(admin.ModelAdmin):
    list_display = ("signup", "kind", "subject", "sent_at")
    list_filter = ("kind",)
    search_fields = ("signup__email",)
