"""Real dispatcher processes for the tests, against the test database."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


def database_url() -> str:
    """A URL for the database the tests run in (pytest-django's test database)."""
    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


class DispatcherProcess:
    """``manage.py run_workflow_dispatcher`` in a subprocess; its output goes to a temp file."""

    def __init__(
        self,
        *args: str,
        settings: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """``env`` adds environment variables (a skewed clock: :func:`skewed_clock`)."""
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        environment = {
            **os.environ,
            "DATABASE_URL": database_url(),
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "PYTHONPATH": str(ROOT),
            "PGBUS_WORKFLOWS_JSON": json.dumps(settings or {}),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "django", "run_workflow_dispatcher", "-v", "2", *args],
            cwd=ROOT,
            env=environment,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def output(self) -> str:
        """Everything the process printed so far."""
        return Path(self.log.name).read_text()

    def send(self, sig: int) -> None:
        """Send a signal to the process."""
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 30) -> int:
        """Wait for the exit code; fail the test (with the output) when it does not exit."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"dispatcher did not exit in {timeout}s:\n{self.output()}") from None

    def kill(self) -> None:
        """SIGKILL it (nothing runs after this, like a crashed machine)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        """End it whatever state it is in, and remove its log."""
        self.kill()
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)


#: Debian's libfaketime (package faketime), its thread-safe build: preloaded, it shifts the process's clocks.
LIBFAKETIME = next(iter(sorted(Path("/usr/lib").glob("*/faketime/libfaketimeMT.so.1"))), None)


def skewed_clock(offset: str) -> dict[str, str]:
    """Environment that runs a process with its clock shifted by ``offset`` (``"+60s"``, ``"-60s"``).

    Only the wall clock is shifted, as on a host whose clock is off: the monotonic clock (which
    the kernel's timed waits use) stays true. The library is preloaded directly (the
    ``faketime`` command would fork, and a signal sent to it would not reach the dispatcher).
    Under it ``time.sleep`` fails with EINVAL (libfaketime's clock_nanosleep): bodies run in
    such a process wait with ``threading.Event().wait`` instead.
    """
    if LIBFAKETIME is None:
        raise RuntimeError("libfaketime is not installed: apt-get install faketime")
    return {"LD_PRELOAD": str(LIBFAKETIME), "FAKETIME": offset, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def eventually(check: Callable[[], Any], timeout: float = 30, interval: float = 0.05, what: str = "") -> Any:
    """Poll ``check`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or check}")
        time.sleep(interval)
