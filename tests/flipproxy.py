"""An HTTP proxy that damages every upload body on its way: one byte of each PUT or POST
body over 1000 bytes is flipped (in the middle), so a store that checks a body's checksum
refuses it every time. Answers pass unchanged. For test_cp.py's exit-status tests (the
GET side is proxykit.HttpProxy's flip_gets)."""

from __future__ import annotations

import http.client
import http.server
import threading
from urllib.parse import urlsplit

HOP = {"content-length", "transfer-encoding", "connection"}


class FlipProxy:
    def __init__(self, upstream: str):
        target = urlsplit(upstream)

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _forward(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                if body and self.command in ("PUT", "POST") and len(body) > 1000:
                    i = len(body) // 2
                    body = body[:i] + bytes([body[i] ^ 0x55]) + body[i + 1:]
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
                if body is not None:
                    headers["Content-Length"] = str(len(body))
                c = http.client.HTTPConnection(target.hostname, target.port, timeout=120)
                c.request(self.command, self.path, body=body, headers=headers)
                r = c.getresponse()
                data = r.read()
                self.send_response(r.status)
                for k, v in r.getheaders():
                    if k.lower() not in HOP:
                        self.send_header(k, v)
                length = r.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data))
                self.send_header("Content-Length", length)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                c.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
