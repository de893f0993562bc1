"""The inference layer's commands: one module per command group, assembled by :mod:`inference.cli.app`.

Contract: ``inference.cli:main`` (the ``judgestore`` console script, as
pyproject.toml names it) imports :func:`inference.cli.app.main` when it is
called, so that importing one command module does not assemble the whole
app; a Ctrl-C while the commands are imported (the first few tenths of a
second) ends the program as one during a command does: the line
"interrupted" on stderr, exit status 130, no traceback.
"""

from __future__ import annotations

import sys


def main() -> None:
    """The ``judgestore`` console script."""
    try:
        from inference.cli.app import main as run
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.exit(130)
    run()
