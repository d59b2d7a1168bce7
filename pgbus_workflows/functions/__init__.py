"""Durable functions: workflows written as code, run by the same engine as step classes (DESIGN 18)."""

from .async_context import AsyncDurableContext
from .classes import DurableWorkflow, durable
from .context import DurableContext
from .names import ENTRY

__all__ = ["ENTRY", "AsyncDurableContext", "DurableContext", "DurableWorkflow", "durable"]
