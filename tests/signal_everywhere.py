"""Helper process: a dispatcher sent SIGTERM at each line, in turn, of its loop's round.

    python -m tests.signal_everywhere ROUND FIRST LAST

For each k in FIRST..LAST a new dispatcher runs on this process's main thread (so its signal
handlers are installed). From the start of its loop's ROUND-th round (the first also sets up
its statements, while the first heartbeat is under way), the k-th line the main thread runs
in the engine's modules or in the standard library's ``threading``, ``selectors`` and
``socket`` (where the loop's locks and waits are) sends this process a SIGTERM, so the
handler runs between those two lines. Prints ``k stopped`` when ``run()`` returned, and at
the end ``rows left: N``: the dispatcher rows the stopped ones left behind. A dispatcher not
stopped within ``TRIAL_LIMIT`` seconds (its handler waits for a lock the loop holds, say)
ends the process: ``k hung``, exit code 3.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

import django

WATCHED = ("/pgbus_workflows/", "/threading.py", "/selectors.py", "/socket.py")
#: Seconds a dispatcher has to stop after its SIGTERM (it takes a few hundredths).
TRIAL_LIMIT = 10.0


def sigterm_at_line(round_: int, k: int) -> Any:
    """A trace function that sends SIGTERM at the k-th watched line from the loop's ``round_``-th round on."""
    state = {"armed": False, "lines": 0, "rounds": 0}

    def trace(frame: FrameType, event: str, arg: object) -> Any:
        filename = frame.f_code.co_filename
        if event == "call":
            if frame.f_code.co_name == "_tick" and filename.endswith("/pgbus_workflows/dispatcher/process.py"):
                state["rounds"] += 1
                state["armed"] = state["armed"] or state["rounds"] == round_
            return trace if any(part in filename for part in WATCHED) else None
        if event == "line" and state["armed"]:
            state["lines"] += 1
            if state["lines"] == k:
                state["armed"] = False
                os.kill(os.getpid(), signal.SIGTERM)
        return trace

    return trace


def say(line: str) -> None:
    """One line to the test reading this process's output."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def hung(k: int) -> None:
    """The k-th dispatcher did not stop in time: say so and end the process."""
    say(f"{k} hung")
    os._exit(3)


def main(round_: int, first: int, last: int) -> None:
    """Run the dispatchers, one per line."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    django.setup()
    from pgbus_workflows.dispatcher import WorkflowDispatcher
    from pgbus_workflows.models import Dispatcher

    names = []
    for k in range(first, last + 1):
        dispatcher = WorkflowDispatcher(concurrency=1, sweep=False, schedules=False)
        names.append(dispatcher.name)
        watchdog = threading.Timer(TRIAL_LIMIT, hung, args=(k,))
        watchdog.daemon = True
        watchdog.start()
        sys.settrace(sigterm_at_line(round_, k))
        try:
            dispatcher.run()
        finally:
            sys.settrace(None)
            watchdog.cancel()
        say(f"{k} stopped")
    say(f"rows left: {Dispatcher.objects.filter(name__in=names).count()}")


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
