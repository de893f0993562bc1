"""The inference layer's commands: one module per command group, assembled by :mod:`inference.cli.app`.

Contract: ``inference.cli:main`` (the ``judgestore`` console script, as
pyproject.toml names it) imports :func:`inference.cli.app.main` when it is
called, so that importing one command module does not assemble the whole
app; a Ctrl-C or SIGTERM while the commands are imported (the first
second or so) ends the program as one during a command does: the line
"interrupted as the command started: nothing was done" on stderr (with
``--json``, the JSON object), exit status 130
or 143, no traceback.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType


def main() -> None:
    """The ``judgestore`` console script."""
    ended_by: list[int] = []

    def stop(signum: int, frame: FrameType | None) -> None:  # until the program sets its own (run_program)
        ended_by.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        from inference.cli.app import main as run
    except KeyboardInterrupt:
        from store.interrupts import say_interrupted  # stdlib only

        say_interrupted("--json" in sys.argv[1:])
        sys.exit(128 + signal.SIGTERM if ended_by else 130)
    run()
