"""Durable functions: workflows written as code, run by the same engine as step classes (DESIGN 18)."""

from .classes import DurableWorkflow, durable
from .context import DurableContext
from .names import ENTRY

__all__ = ["ENTRY", "DurableContext", "DurableWorkflow", "durable"]
