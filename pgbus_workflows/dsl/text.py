"""What a text column can store: the check of keys and names users give (no ORM)."""

from __future__ import annotations

from typing import Any


def unstorable(value: Any) -> str | None:
    """Why PostgreSQL cannot store the string ``value`` in a text column, or None when it can.

    A NUL character is refused by the server (``DataError``) and a lone surrogate by the
    driver (``UnicodeEncodeError``); checking first lets the caller raise its own exception,
    naming what was given, before anything is written.
    """
    if not isinstance(value, str):
        return None
    if "\x00" in value:
        return "contains a NUL character (\\x00)"
    for char in value:
        if 0xD800 <= ord(char) <= 0xDFFF:
            return f"contains a lone surrogate ({char!r})"
    return None
