"""A stop signal may come between any two lines the dispatcher's main thread runs.

Each test runs ``tests/signal_everywhere.py`` in a process of its own: one dispatcher after
another, each sent SIGTERM at the next line of its loop, and every one must stop.
"""

import json
import os
import signal
import subprocess
import sys
import threading

import pytest
from django.test import override_settings

from pgbus_workflows.dispatcher import WorkflowDispatcher
from pgbus_workflows.models import Dispatcher
from tests.procs import ROOT, database_url, eventually
from tests.threads import Worker

pytestmark = pytest.mark.django_db(transaction=True)

#: Lines of one idle round of the loop (its claim, its wait, the wake-up), with some to spare:
#: about 300 in the watched modules.
ROUND = 360


def sigterm_at_each_line(round_, lines):
    """Run the helper; assert each dispatcher stopped, and none left its row behind."""
    environment = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PGBUS_WORKFLOWS_JSON": json.dumps({"POLL_INTERVAL": 0.01}),
    }
    done = subprocess.run(
        [sys.executable, "-m", "tests.signal_everywhere", str(round_), "1", str(lines)],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )
    printed = done.stdout.splitlines()
    assert done.returncode == 0, f"{printed[-1:]} (exit code {done.returncode})\n{done.stderr[-3000:]}"
    assert printed[:-1] == [f"{k} stopped" for k in range(1, lines + 1)]
    assert printed[-1] == "rows left: 0", "a stopped dispatcher's row was registered again"


@pytest.mark.processes
def test_a_sigterm_at_any_line_of_the_loops_round_stops_the_dispatcher():
    """Python runs the handler wherever the main thread is: one that set the loop's wake-up
    ``threading.Event`` hung when the loop held that event's lock (a CI run saw it)."""
    sigterm_at_each_line(2, ROUND)


@pytest.mark.processes
def test_a_sigterm_during_the_first_heartbeat_leaves_no_dispatcher_row():
    """The first round's claim runs beside the first heartbeat: a heartbeat under way at the
    stop once found the row deleted by the shutdown and registered it again."""
    sigterm_at_each_line(1, 60)


# Not PREPARED_STATEMENTS: on this process's connection, it would outlast the test.
@override_settings(PGBUS_WORKFLOWS={"POLL_INTERVAL": 60, "PREPARED_STATEMENTS": False})
def test_a_sigterm_delivered_to_another_thread_wakes_the_waiting_loop_at_once():
    """Python runs handlers on the main thread only, and a signal the kernel gave another
    thread does not interrupt the main thread's wait: the handler would wait for the poll
    (a minute here). The wake-up socket is the process's signal wake-up fd, so it does not."""
    dispatcher = WorkflowDispatcher(concurrency=1, sweep=False, schedules=False)
    sent = threading.Event()
    entered: list[float] = []  # the timeout of each wait the loop began
    woken: list[bool] = []  # what each returned: True when woken, False when its poll ran out
    wait = dispatcher._wake.wait

    def watched_wait(timeout):
        entered.append(timeout)
        woken.append(wait(timeout))
        return woken[-1]

    dispatcher._wake.wait = watched_wait

    def from_another_thread():
        # The first wait ends on the listener's wake-up once it listens; the second waits for the poll.
        eventually(lambda: len(entered) == 2 and len(woken) == 1, what="the loop's second wait")
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
        sent.set()

    Worker(from_another_thread).start()
    assert dispatcher.run() == 0  # on this, the main thread: its handlers are installed
    assert sent.is_set()
    assert woken == [True, True], "the loop slept through the signal until its poll"
    assert not Dispatcher.objects.filter(name=dispatcher.name).exists()
