"""Real threads for the race tests, each with its own database connection."""

import threading

from django.db import connection

JOIN_TIMEOUT = 30


class Worker(threading.Thread):
    """Runs ``target`` in a thread with its own connection; keeps its result or exception."""

    def __init__(self, target, *args):
        super().__init__(daemon=True)
        self._target_fn = target
        self._args = args
        self.result = None
        self.error = None

    def run(self):
        try:
            self.result = self._target_fn(*self._args)
        except BaseException as error:  # reported to the test by finish()
            self.error = error
        finally:
            connection.close()

    def finish(self):
        """Join (at most JOIN_TIMEOUT seconds), re-raise the thread's exception, return its result."""
        self.join(JOIN_TIMEOUT)
        assert not self.is_alive(), "thread did not finish"
        if self.error is not None:
            raise self.error
        return self.result
