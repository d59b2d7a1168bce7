"""The dispatcher process: its loop, worker pool, sweep, schedule leader and wake-ups.

``process`` is the loop (``WorkflowDispatcher``, run by ``manage.py run_workflow_dispatcher``);
``workers`` + ``lanes`` the pool, ``sweep`` the housekeeping phases, ``scheduler`` the schedule
leader, ``wakeups`` + ``waker`` who claims when. ``WorkflowDispatcher`` is re-exported so
``from pgbus_workflows.dispatcher import WorkflowDispatcher`` keeps working;
``on_loop_shutdown`` is how an ``async def`` body's module-level client is closed.
"""

from .coroutines import on_loop_shutdown
from .process import WorkflowDispatcher

__all__ = ["WorkflowDispatcher", "on_loop_shutdown"]
