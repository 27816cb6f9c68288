"""The CPU lanes' emulated link: one thread that runs a link lane's copies in issue order.

On a GPU a copy on the h2d stream runs on the copy engine while the thread that issued it
goes on; the CPU lanes (real/backend.py `CpuLanes`) emulate that with a `LinkWorker`: the
issuing thread queues the copy and goes on, the worker (one torch thread) runs the queue
in order, and `ticket()` / `wait(ticket)` are the lane's events (a ticket is the number of
copies queued when it was taken; it is done once the worker finished that many). Issue 45:
the host worker used to run each chunk's upload itself, after the chunk's AdamW and before
the next chunk's, so the uploads added to the host lane's busy time instead of running
beside it (with the link thread each chunk's upload starts when the chunk is ready; off by
default, real/backend.py `cpu_link_lanes` says why). A copy that raises is
kept and re-raised by the next `wait` or `drain`, so a failed copy never goes unnoticed.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from collections import deque
from typing import Callable

import torch


class LinkError(RuntimeError):
    """A copy on the emulated link failed; the original exception is chained."""


_OPEN_LINKS: weakref.WeakSet = weakref.WeakSet()


@atexit.register
def _close_open_links() -> None:
    """At interpreter exit, finish every open link's queued copies (as the host lane does,
    real/host_lane.py: a daemon thread inside a torch copy while the process tears torch
    down aborts it)."""
    for link in list(_OPEN_LINKS):
        link.close()


class LinkWorker:
    def __init__(self, lane: str) -> None:
        self.lane = lane
        self._queue: deque[Callable[[], None]] = deque()
        self._cv = threading.Condition()
        self._queued = 0
        self._done = 0
        self._error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=f"link-{lane}", daemon=True)
        self._thread.start()
        _OPEN_LINKS.add(self)

    def submit(self, fn: Callable[[], None]) -> None:
        """Queue `fn` (a copy and its span) behind every copy queued before it."""
        with self._cv:
            if self._closed:
                raise LinkError(f"the emulated {self.lane} link is closed")
            self._queue.append(fn)
            self._queued += 1
            self._cv.notify_all()

    def ticket(self) -> int:
        """The event of everything queued so far."""
        with self._cv:
            return self._queued

    def done(self, ticket: int) -> bool:
        """Whether the copies before `ticket` are done (without waiting)."""
        with self._cv:
            return self._done >= ticket

    def wait(self, ticket: int) -> None:
        """Block until the copies before `ticket` are done; re-raise a failed one."""
        with self._cv:
            while self._done < ticket and self._error is None:
                self._cv.wait()
            self._raise()

    def drain(self) -> None:
        self.wait(self.ticket())

    def _raise(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise LinkError(f"a copy on the emulated {self.lane} link failed: {err!r}") \
                from err

    def _loop(self) -> None:
        torch.set_num_threads(1)  # one copy engine: a single thread's copies
        while True:
            with self._cv:
                while not (self._queue or self._closed):
                    self._cv.wait()
                if not self._queue:
                    return
                fn = self._queue[0]
            try:
                fn()
            except BaseException as err:  # kept for the next wait; never die silently
                with self._cv:
                    self._error = err
            with self._cv:
                self._queue.popleft()
                self._done += 1
                self._cv.notify_all()

    def close(self) -> None:
        """Finish the queued copies, stop the thread, and re-raise a failed copy."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout=60)
        _OPEN_LINKS.discard(self)
        with self._cv:
            self._raise()
