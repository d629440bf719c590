"""Serving a WSGI app from a daemon thread with werkzeug's server, over HTTP or HTTPS."""

from __future__ import annotations

import logging
import ssl
import threading
from pathlib import Path

from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

log = logging.getLogger(__name__)


class _Quiet(WSGIRequestHandler):
    """Sends werkzeug's per-request lines to this module's logger at DEBUG instead of stderr."""

    def log(self, kind: str, message: str, *args) -> None:
        log.debug("%s %s %s", kind, self.address_string(), message % args)


class Served:
    """A werkzeug server running in a daemon thread; `url` is where clients reach it."""

    def __init__(self, server: BaseWSGIServer):
        self.server = server
        self.host, self.port = server.server_address[:2]
        where = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"{'https' if server.ssl_context else 'http'}://{where}:{self.port}"
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops serving and closes the listening socket."""
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def serve(app, host: str, port: int = 0, cert: str | Path | None = None, key: str | Path | None = None) -> Served:
    """Serves `app` on (host, port) from a thread (port 0: any free port); HTTPS when `cert` and `key` are given.

    The server is threaded, so a slow client does not hold up the others (the TLS handshake itself runs on
    the accepting thread).
    """
    context = None
    if cert:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key))
    return Served(make_server(host, port, app, threaded=True, ssl_context=context, request_handler=_Quiet))
