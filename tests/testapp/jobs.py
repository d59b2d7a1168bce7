"""Module-level job functions for fan-out tests (fan-out jobs must live in an installed app)."""

from .models import SideEffect


def square(n: int) -> int:
    """Record the call and return n squared."""
    SideEffect.objects.create(label="square", key=str(n))
    return n * n


def fail_on(n: int, bad: list[int]) -> int:
    """Raise for the numbers in ``bad``."""
    SideEffect.objects.create(label="fail_on", key=str(n))
    if n in bad:
        raise ValueError(f"job {n} fails on purpose")
    return n
