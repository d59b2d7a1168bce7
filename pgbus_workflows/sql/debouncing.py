"""The statement of a debounced ``start()``: the lock that takes the starts of one key one at a time.

Registered in the same :data:`.statements.BUILDERS` as every other statement.
"""

from __future__ import annotations

from typing import Any

from .statements import builds


@builds("debounce_lock")
def debounce_lock(conn: Any) -> str:
    """Wait for the transaction-level advisory lock on a text's 64-bit hash (PostgreSQL); the commit releases it."""
    return "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"
