"""The tasks of Django's task backend in the operator console: a list read as the task API reads them.

Each row is a task's run (``DjangoTask``, a proxy of ``WorkflowRun``): its id links to the run's
page, which shows its attempts with their errors and tracebacks and offers cancel and rerun.
The state column says what ``get_result()`` would (READY, RUNNING, SUCCESSFUL, FAILED);
nothing here imports the task API, so the console works without it.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Count, Model, OuterRef, Q, QuerySet, Subquery
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..models import DjangoTask, WorkflowStep
from ..states import RunStatus, StepStatus
from .display import run_url, status_badge
from .paging import workflow_id_range
from .records import ReadOnlyAdmin

#: The task API's state of a run, by the run's status (an ongoing run: by its current attempt).
STATES = {RunStatus.FINISHED: "SUCCESSFUL", RunStatus.CANCELLED: "FAILED"}
#: How a state's badge is coloured (the runs' colours: ``static/pgbus_workflows/admin.css``).
BADGES = {"READY": "ready", "RUNNING": "performing", "SUCCESSFUL": "finished", "FAILED": "cancelled"}


class TaskStateFilter(admin.SimpleListFilter):
    """Tasks by the state ``get_result()`` gives them, as ``?state=FAILED`` (a failed task's run is cancelled)."""

    title = _("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        """The task API's states, in the order a task goes through them."""
        return [(state, state) for state in ("READY", "RUNNING", "SUCCESSFUL", "FAILED")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        """The tasks in the chosen state (``running``: the latest attempt's status, annotated by the list)."""
        chosen = self.value()
        ended = [status for status, state in STATES.items() if state == chosen]
        if ended:
            return queryset.filter(status=ended[0])
        ongoing = queryset.exclude(status__in=list(STATES))
        if chosen == "RUNNING":
            return ongoing.filter(running=StepStatus.IN_PROGRESS)
        if chosen == "READY":
            return ongoing.filter(Q(running__isnull=True) | ~Q(running=StepStatus.IN_PROGRESS))
        return queryset


@admin.register(DjangoTask)
class DjangoTaskAdmin(ReadOnlyAdmin):
    """Enqueued tasks, newest first: their function, queue, state, attempts and last error."""

    list_display = ("task_id", "function", "queue", "state", "attempts", "created_at", "finished_at", "last_error")
    list_filter = (TaskStateFilter,)
    sortable_by = ("created_at",)
    ordering = ("-id",)
    search_fields = ("workflow_id",)
    search_help_text = _("A task id, or its first 8 hex digits or more.")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        """The known task classes' runs, with their attempts counted and their last error (one query a page)."""
        attempts = WorkflowStep.objects.filter(run_id=OuterRef("pk")).order_by("-attempt")
        return (
            DjangoTask.objects.of_known_classes()
            .annotate(
                attempt_count=Count("steps", filter=Q(steps__started_at__isnull=False)),
                running=Subquery(attempts.values("status")[:1]),
                error=Subquery(attempts.exclude(error_class="").values("error_class")[:1]),
            )
            .order_by("-id")
        )

    def search_condition(self, term: str) -> Q:
        """The task whose id begins with ``term`` (the workflow id's unique index)."""
        found = workflow_id_range(term)
        return Q(workflow_id__range=found) if found else Q(pk__in=[])

    def has_view_permission(self, request: HttpRequest, obj: Model | None = None) -> bool:
        """Whoever may view runs may view tasks (they are runs)."""
        return bool(request.user.has_perm("pgbus_workflows.view_workflowrun"))

    def has_module_permission(self, request: HttpRequest) -> bool:
        """Whether the tasks show on the admin index: as :meth:`has_view_permission` says."""
        return self.has_view_permission(request)

    @admin.display(description=_("task id"))
    def task_id(self, obj: DjangoTask) -> SafeString:
        """The result id ``enqueue()`` gave, linked to the run's page (attempts, errors, cancel, rerun)."""
        return format_html('<a href="{}">{}</a>', run_url(self.admin_site.name, obj), obj.workflow_id)

    @admin.display(description=_("function"))
    def function(self, obj: DjangoTask) -> str:
        """The task function's dotted path."""
        return str(obj.arguments.get("task", ""))

    @admin.display(description=_("queue"))
    def queue(self, obj: DjangoTask) -> str:
        """The queue the task was enqueued on."""
        return str(obj.arguments.get("queue_name", ""))

    @admin.display(description=_("state"))
    def state(self, obj: Any) -> SafeString:
        """What ``get_result()`` says of it."""
        name = STATES.get(obj.status) or ("RUNNING" if obj.running == StepStatus.IN_PROGRESS else "READY")
        return status_badge(BADGES[name], name)

    @admin.display(description=_("attempts"))
    def attempts(self, obj: Any) -> int:
        """How many attempts have started."""
        return int(obj.attempt_count)

    @admin.display(description=_("last error"))
    def last_error(self, obj: Any) -> str:
        """The error class of the latest attempt that raised one, or an empty string."""
        return str(obj.error or "")
