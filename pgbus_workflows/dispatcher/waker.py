"""A wake-up for the dispatcher's main loop that takes no lock, so a signal handler may set it.

A ``threading.Event`` cannot be set from a signal handler: Python runs the handler on the main
thread between two bytecodes, possibly while that thread holds the event's own lock inside
``Event.wait``, and the handler's ``set()`` then waits for that lock forever. A SIGTERM that
came at that moment left the dispatcher hung. Here ``set()`` writes a byte to a socket pair
and ``wait()`` polls the other end, so any thread, and a signal handler, may wake the loop;
the socket is also the process's signal wake-up fd (:meth:`Waker.wake_on_signals`), which wakes
the loop even when the kernel delivered the signal to another thread. :func:`stop_signals`
installs the dispatcher's SIGTERM/SIGINT handler with both. :func:`join_until` joins a thread in
short waits, so a handler still runs soon on the main thread while it waits for another.
"""

from __future__ import annotations

import logging
import selectors
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

logger = logging.getLogger("pgbus_workflows")

#: A signal handler, as ``signal.signal`` takes it.
Handler = Callable[[int, FrameType | None], object]
#: The longest :func:`join_until` waits without going back to the interpreter.
JOIN_SLICE = 0.2


class Waker:
    """Wakes the thread waiting in :meth:`wait`; :meth:`set` is safe from any thread and from a signal handler."""

    def __init__(self) -> None:
        self._receiver, self._sender = socket.socketpair()
        self._receiver.setblocking(False)
        self._sender.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._receiver, selectors.EVENT_READ)

    def set(self) -> None:
        """Wake the waiter (now, or at its next :meth:`wait`)."""
        try:
            self._sender.send(b"\0")
        except OSError:
            pass  # the buffer is full (a wake-up is pending anyway), or the waker is closed

    def wait(self, timeout: float) -> bool:
        """Wait until set or ``timeout`` seconds; True when set. Either way it is cleared."""
        woken = bool(self._selector.select(max(timeout, 0.0)))
        if woken:
            self._clear()
        return woken

    def _clear(self) -> None:
        try:
            while self._receiver.recv(4096):
                pass
        except BlockingIOError:
            pass

    @contextmanager
    def wake_on_signals(self) -> Iterator[None]:
        """For the block, a signal wakes the waiter, whichever thread the kernel delivered it to.

        Main thread only (``signal.set_wakeup_fd``); the previous wake-up fd is restored after.
        """
        previous = signal.set_wakeup_fd(self._sender.fileno(), warn_on_full_buffer=False)
        try:
            yield
        finally:
            signal.set_wakeup_fd(previous)

    def close(self) -> None:
        """Release the sockets; a later :meth:`set` does nothing."""
        self._selector.close()
        self._receiver.close()
        self._sender.close()


@contextmanager
def stop_signals(handler: Handler, waker: Waker) -> Iterator[None]:
    """Install SIGTERM/SIGINT handlers for the block (any signal wakes ``waker``) and restore the previous ones."""
    if threading.current_thread() is not threading.main_thread():  # signal.signal() would raise
        logger.warning("Not on the main thread: SIGTERM/SIGINT are not handled")
        yield
        return
    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        with waker.wake_on_signals():
            yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def join_until(thread: threading.Thread, deadline: float) -> None:
    """Join ``thread`` until it ends or the ``time.monotonic()`` deadline passes, in short waits.

    A signal the kernel hands to another thread runs its Python handler on the main thread
    only once that thread is back in the interpreter: a plain ``join`` would hold a second
    SIGTERM's "exit at once" up until the thread ended or the wait's end.
    """
    while thread.is_alive() and (left := deadline - time.monotonic()) > 0:
        thread.join(min(left, JOIN_SLICE))
