"""Timing a client's calls, shared by this project's client and the peers' (no Django: any virtualenv)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def back_to_back(call: Callable[[], Any], runs: int) -> dict[str, Any]:
    """``call()`` ``runs`` times as fast as one process makes them: the wall clock of the first
    call and of the last return, and each call's wall and CPU seconds."""
    walls, cpus = [], []
    first_call = time.time()
    for _ in range(runs):
        wall, cpu = time.perf_counter(), time.process_time()
        call()
        cpus.append(time.process_time() - cpu)
        walls.append(time.perf_counter() - wall)
    return {"first_call": first_call, "last_return": time.time(), "wall": walls, "cpu": cpus}
