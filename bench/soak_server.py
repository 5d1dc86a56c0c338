"""The soak's API server: the example project's WSGI application on Django's threaded server.

    python -m bench.soak_server PORT

Django's threaded development server, as ``manage.py runserver --noreload`` runs it (one thread
per client connection), except that each thread closes its database connections when it ends;
on the soak database through
``bench.settings``. Each request's ``X-Soak-Request`` header tags the errors recorded while it
runs (bench/faults.py), so the soak can tell what caused each 5xx response it received.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
os.environ.setdefault("SOAK_SOURCE", "server")


def tagged(app: Callable[..., Iterable[bytes]]) -> Callable[..., Iterable[bytes]]:
    from bench import faults

    def wsgi(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        faults.set_request(environ.get("HTTP_X_SOAK_REQUEST"))
        try:
            return app(environ, start_response)
        finally:
            faults.set_request(None)

    return wsgi


def main() -> None:
    import django

    django.setup()
    from django.core.handlers.wsgi import WSGIHandler
    from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass  # the soak counts statuses itself

    # ThreadedWSGIServer, unlike runserver's, closes a thread's connections when it ends.
    server = ThreadedWSGIServer(("127.0.0.1", int(sys.argv[1])), Quiet)
    server.daemon_threads = True
    server.set_app(tagged(WSGIHandler()))
    server.serve_forever()


if __name__ == "__main__":
    main()
