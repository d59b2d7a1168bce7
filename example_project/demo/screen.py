"""The live view: a table of runs by class and status, and a feed of what just happened.

On a terminal the block is redrawn in place (ANSI: cursor up, clear to the end); otherwise
every feed line and every change of the counts is printed once, as plain lines (CI logs).
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections import deque
from collections.abc import Iterable
from typing import Any, Protocol

from pgbus_workflows.states import RunStatus

STATUSES = [s.value for s in RunStatus]
Counts = dict[tuple[str, str], int]


class Output(Protocol):
    """Where the screen writes: a text stream or a command's ``self.stdout``."""

    def write(self, msg: str, /) -> Any: ...
    def flush(self) -> Any: ...


class Feed(logging.Handler):
    """Collects the demo's lines and the library's log lines (thread-safe), oldest first."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self.lines: deque[tuple[float, str]] = deque()
        self.clock = lambda: 0.0
        self._lock_feed = threading.Lock()

    def add(self, text: str) -> None:
        with self._lock_feed:
            self.lines.append((self.clock(), text))

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "Not on the main thread" in message or message.startswith("Step failed"):
            return  # the demo runs its dispatcher in a thread on purpose; failures come from step_finished
        self.add(f"[{record.levelname.lower()}] {message}")

    def take(self) -> list[tuple[float, str]]:
        """The lines added since the last call."""
        with self._lock_feed:
            lines = list(self.lines)
            self.lines.clear()
        return lines


def table(classes: Iterable[str], counts: Counts) -> list[str]:
    """The runs by class and status, one line per class."""
    names = list(classes)
    width = max([len("workflow"), *map(len, names)])
    head = f"  {'workflow':<{width}}" + "".join(f"{s:>{len(s) + 1}}" for s in STATUSES) + f"{'total':>7}"
    rows = [head]
    for name in names:
        cells = [counts.get((name, s), 0) for s in STATUSES]
        line = "".join(f"{n or '.':>{len(s) + 1}}" for n, s in zip(cells, STATUSES, strict=True))
        rows.append(f"  {name:<{width}}{line}{sum(cells):>7}")
    return rows


def summary_line(classes: Iterable[str], counts: Counts) -> str:
    """The counts on one line: ``signup_drip 2 waiting 1 finished | ...``."""
    parts = []
    for name in classes:
        cells = [f"{counts[(name, s)]} {s}" for s in STATUSES if counts.get((name, s))]
        parts.append(f"{name} {', '.join(cells) or '-'}")
    return " | ".join(parts)


class Screen:
    """Draws the live view to ``out``: in place on a terminal, as plain lines elsewhere."""

    def __init__(self, out: Output, classes: list[str], tty: bool, feed_lines: int = 8) -> None:
        self.out = out
        self.classes = classes
        self.tty = tty
        self.recent: deque[str] = deque(maxlen=feed_lines)
        self._drawn = 0
        self._last: Counts | None = None

    def update(self, elapsed: float, counts: Counts, lines: list[tuple[float, str]], status: str) -> None:
        """Show the counts and the new feed lines."""
        stamped = [f"{at:5.1f}s  {text}" for at, text in lines]
        if not self.tty:
            for line in stamped:
                self.out.write(line + "\n")
            if counts != self._last:
                self.out.write(f"{elapsed:5.1f}s  runs: {summary_line(self.classes, counts)}\n")
                self._last = dict(counts)
            self.out.flush()
            return
        self.recent.extend(stamped)
        columns = shutil.get_terminal_size((100, 24)).columns
        block = [
            *table(self.classes, counts),
            "",
            f"  {elapsed:5.1f}s  {status}",
            "",
            *(f"  {line}" for line in self.recent),
        ]
        block = [line[: columns - 1] for line in block]  # a wrapped line would break the redraw
        clear = f"\x1b[{self._drawn}A\r\x1b[J" if self._drawn else ""
        self.out.write(clear + "\n".join(block) + "\n")
        self.out.flush()
        self._drawn = len(block)

    def finish(self) -> None:
        """Leave the last drawing on screen; what follows prints below it."""
        self._drawn = 0
        if self.tty:
            self.out.write("\n")
