"""The inference layer's commands: one module per command group, assembled by :mod:`inference.cli.app`.

Contract: ``inference.cli:main`` (the ``judgestore`` console script, as
pyproject.toml names it) is :func:`inference.cli.app.main`, imported when
first asked for, so that importing one command module does not assemble the
whole app.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "main":
        from inference.cli.app import main

        return main
    raise AttributeError(f"module 'inference.cli' has no attribute {name!r}")
