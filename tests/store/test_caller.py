"""warn_the_caller: a warning is located at the user's line through judgestore's frames and those of the frameworks
that call it, and at judgestore's outermost frame on a thread no user code started."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from store.caller import warn_the_caller


class Said(UserWarning):
    pass


def _function(package: str, source: str, name: str, **names: Any) -> Callable[[], None]:
    """A function compiled as if it were ``package``'s (its module name is what the warning's location is found by),
    in a file of that name."""
    scope: dict[str, Any] = {"__name__": f"{package}.module", "warn_the_caller": warn_the_caller, "Said": Said, **names}
    exec(compile(source, f"<{package}>", "exec"), scope)
    return scope[name]  # type: ignore[no-any-return]


def _warned(call: Callable[[], None]) -> warnings.WarningMessage:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    (warning,) = caught
    return warning


def test_the_warning_is_at_the_users_line_through_judgestore_and_a_framework_that_calls_it() -> None:
    """A LangChain runnable between the user and judgestore was taken for the caller (was)."""
    ours = _function("inference", "def inner():\n    warn_the_caller('x', Said)\n", "inner")
    framework = _function("langchain_core", "def invoke():\n    inner()\n", "invoke", inner=ours)
    outer = _function("store", "def outer():\n    invoke()\n", "outer", invoke=framework)
    warning = _warned(outer)
    assert (warning.filename, warning.category) == (__file__, Said)


def test_on_a_thread_of_judgestore_the_warning_is_at_its_outermost_frame_not_in_the_standard_library() -> None:
    """An async call's worker: every frame is judgestore's or the thread pool's, and the warning pointed at
    threading.py (was)."""
    ours = _function("inference", "def inner():\n    warn_the_caller('x', Said)\n", "inner")
    worker = _function("store", "def work():\n    inner()\n", "work", inner=ours)
    with ThreadPoolExecutor(1) as pool:
        warning = _warned(lambda: pool.submit(worker).result())  # recorded here, raised on the pool's thread
    assert warning.filename == "<store>"


def test_a_filter_on_the_users_module_matches_the_warning() -> None:
    ours = _function("store", "def inner():\n    warn_the_caller('x', Said)\n", "inner")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", category=Said, module=__name__)
        with pytest.raises(Said):
            ours()
