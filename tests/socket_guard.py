"""A socket guard: outgoing connections to anything but loopback raise, so no test can reach the internet.

:func:`install` patches :meth:`socket.socket.connect` and ``connect_ex`` for
the whole process (the CLI subprocess tests install it in the child too);
:func:`uninstall` restores them.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

_original: dict[str, Any] = {}


class NetworkBlockedError(RuntimeError):
    """A test tried to connect somewhere other than loopback."""


def _check(address: Any) -> None:
    if not isinstance(address, tuple):  # AF_UNIX paths and the like stay on this machine
        return
    host = address[0]
    if host == "localhost":
        return
    try:
        if ipaddress.ip_address(host.split("%")[0]).is_loopback:
            return
    except ValueError:
        pass
    raise NetworkBlockedError(f"tests may only connect to loopback, not {address!r}")


def install() -> None:
    if _original:
        return
    _original["connect"] = socket.socket.connect
    _original["connect_ex"] = socket.socket.connect_ex

    def connect(self: socket.socket, address: Any) -> None:
        _check(address)
        return _original["connect"](self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        _check(address)
        return int(_original["connect_ex"](self, address))

    socket.socket.connect = connect  # type: ignore[method-assign,assignment]
    socket.socket.connect_ex = connect_ex  # type: ignore[method-assign,assignment]


def uninstall() -> None:
    if _original:
        socket.socket.connect = _original.pop("connect")  # type: ignore[method-assign,assignment]
        socket.socket.connect_ex = _original.pop("connect_ex")  # type: ignore[method-assign,assignment]
