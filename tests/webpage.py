"""A web server on loopback that is not AWS: every request gets a 200 and the same HTML page (a captive portal's
way, a typo'd port that reaches some other service, AWS_ENDPOINT_URL at a web server)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextlib.contextmanager
def serving(body: bytes) -> Iterator[str]:
    """The server's URL while it serves `body` to every GET, POST, PUT and HEAD."""

    class Page(BaseHTTPRequestHandler):
        def _page(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_HEAD = _page

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
