"""Waiting out a store that stopped answering for a moment (a server restarting, a writer holding a lock long).

Contract: :func:`patiently` runs ``step()`` and, while it raises one of
:data:`TRANSIENT` (a store that may answer again soon), runs it again after
a pause that doubles from 0.2 s to 5 s, for up to ``patience`` seconds in all;
then the last error is raised. ``step`` must be safe to run again (a read; a
write of rows that ignores the ones already there). A shared batch gives the
store that much patience: its jobs' leases outlast a short outage, so waiting
loses nothing, where giving up would throw a generated block away.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from store.errors import DatabaseBusyError, ServerBusyError, ServerUnavailableError

T = TypeVar("T")
log = logging.getLogger(__name__)
TRANSIENT = (ServerUnavailableError, ServerBusyError, DatabaseBusyError)  # a store that may answer again soon


def batch_patience(lease_seconds: float) -> float:
    """How long a shared batch's job waits for its store: a lease (its claims outlast that), half a minute at least."""
    return max(lease_seconds, 30.0)


def patiently(step: Callable[[], T], patience: float) -> T:
    """``step()``, tried again while the store says it may answer soon, for up to ``patience`` seconds."""
    deadline = time.monotonic() + patience
    pause = 0.2
    while True:
        try:
            return step()
        except TRANSIENT as e:
            if time.monotonic() + pause > deadline:
                raise
            log.warning("the store did not answer (%s); trying again in %.1f s", e, pause)
            time.sleep(pause)
            pause = min(pause * 2, 5.0)
