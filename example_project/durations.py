"""The example workflows' durations, from ``settings.EXAMPLE_DURATIONS`` (seconds).

Real workflows wait days (``wait=timedelta(days=2)``); the example project waits seconds so
that ``manage.py demo`` shows the waits happen. ``wait=`` callables read the setting each
time a step is scheduled; ``wait_timeout=`` and ``backoff()`` are fixed when the class is defined.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings

DEFAULTS = {
    "signup_tips_after": 2.0,
    "signup_offer_after": 2.0,
    "payment_timeout": 4.0,
    "carrier_retry": 0.5,
}


def duration(key: str) -> timedelta:
    """The duration ``key`` of ``EXAMPLE_DURATIONS``, or its default."""
    values = getattr(settings, "EXAMPLE_DURATIONS", {})
    return timedelta(seconds=values.get(key, DEFAULTS[key]))
