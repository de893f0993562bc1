"""Serving the browser: a socket bound where asked (loopback unless told otherwise), uvicorn, and what it exposes.

Contract:

* :func:`serve` binds the socket itself, so ``--port 0`` gets a free port
  and the URL it prints is the one that answers; it prints where it serves
  (on stderr), then runs uvicorn until Ctrl-C. A port that cannot be bound is
  an :class:`~store.errors.InvalidInputError` naming it and the way out.
* A host that is not a loopback address (``0.0.0.0``, a LAN address, a name
  that resolves elsewhere) is served only after :func:`exposure` is printed
  (once it is bound: a host it cannot serve on gets only its error):
  who can then read what. Bound to loopback, the app answers only a
  ``Host`` that names this machine: ``localhost``, a loopback address, or
  the host it was given, so the URL it prints answers
  (:class:`store.browse.app.Guard`).
* ``open_browser`` opens the default browser (:mod:`webbrowser`, which
  honours ``$BROWSER``) once the server listens.
* :func:`serving` runs the same server in a thread of this process (tests and
  ``bench/browse_bench.py``) and gives its URL.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
import webbrowser
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import uvicorn

from store.browse.app import create_app
from store.browse.browser import Browser
from store.errors import InvalidInputError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
STARTUP_SECONDS = 10.0
BACKLOG = 2048  # uvicorn's own


def _loopback_address(address: str) -> bool:
    """Whether ``address`` is a loopback address, an IPv4 one written as IPv6 (``::ffff:127.0.0.1``) too, which
    Python 3.11's ``is_loopback`` calls public (then the warning was wrong, and the Host check off: was)."""
    ip = ipaddress.ip_address(address)
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (every address it resolves to is a loopback address)."""
    if host == "localhost":
        return True
    try:
        return _loopback_address(host.strip("[]"))
    except ValueError:
        pass
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(addresses) and all(_loopback_address(str(a).split("%")[0]) for a in addresses)


def exposure(host: str, port: int, where: str) -> str:
    """What serving on a non-loopback ``host`` exposes."""
    return (
        f"browse: {host} is not a loopback address: anyone who can reach this machine on port {port}, and any web "
        "page opened in a browser on a machine that can (through its own domain's DNS, whatever a firewall keeps "
        f"out), can read every prompt, completion, verdict and descriptor in {where}, with no login and no TLS (the "
        "store itself stays read-only). Leave out --host (127.0.0.1) to keep it to this machine."
    )


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host``:``port`` (0: a free port): connections wait in its queue for uvicorn."""
    if not host.strip():  # the resolver would say "Name or service not known", which hides what is wrong
        raise InvalidInputError(
            "--host is empty: give an address, e.g. 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)"
        )
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as e:
        raise InvalidInputError(f"cannot serve on {host}: {e.strerror or e}; check --host") from e
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
    except OSError as e:
        sock.close()
        raise InvalidInputError(
            f"cannot serve on {host} port {port}: {e.strerror or e}; choose another with --port (0: any free port)"
        ) from e
    return sock


def url_of(sock: socket.socket) -> str:
    """The URL a socket answers at (this machine's name when it listens on every address)."""
    host, port = sock.getsockname()[:2]
    if ipaddress.ip_address(host.split("%")[0]).is_unspecified:
        host = socket.gethostname()
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


def _server(browser: Browser, host: str) -> uvicorn.Server:
    app = create_app(browser, loopback_only=is_loopback(host), hosts=(host,))  # the URL printed names it
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", server_header=False)
    return uvicorn.Server(config)


def serve(
    browser: Browser,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    *,
    open_browser: bool = False,
    say: Callable[[str], None] = print,
) -> None:
    """Serve ``browser`` until Ctrl-C (see the module docstring)."""
    sock = bind(host, port)  # first: a host it cannot serve on gets its error, not a warning before it
    if not is_loopback(host):
        say(exposure(host, sock.getsockname()[1], browser.where))  # the port bound (--port 0: the one given)
    url = url_of(sock)
    server = _server(browser, host)
    say(f"browse: {browser.where} (read-only) at {url} (Ctrl-C stops)")
    if open_browser:
        threading.Thread(target=_open_when_started, args=(server, url), daemon=True).start()
    with sock:
        server.run(sockets=[sock])


def _open_when_started(server: uvicorn.Server, url: str) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    if server.started:
        webbrowser.open(url)


@contextmanager
def serving(browser: Browser, host: str = DEFAULT_HOST, port: int = 0) -> Iterator[str]:
    """The browser served from a thread of this process while the block runs; gives its URL."""
    sock = bind(host, port)
    server = _server(browser, host)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the browser's server did not start")
            time.sleep(0.01)
        yield url_of(sock)
    finally:
        server.should_exit = True
        thread.join(STARTUP_SECONDS)
        sock.close()
