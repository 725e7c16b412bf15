"""A small recording HTTP reverse proxy, for tests that must see or change what goes
between bucketfs and a store (test_billing.py: the billing headers of every request;
test_cp.py: a store that does not echo checksums, a body damaged on the way).

`HttpProxy(upstream)` listens on a free loopback port (`.url`, for `--endpoint`), forwards
each request to `upstream` as it came (headers, body) and keeps (method, path, lowercased
request headers) of every request in `.requests` (`.take()` returns and clears them), and
counts the request bodies' bytes in `.sent` (what a client uploaded, measured outside it). On
the way back it can drop answer headers (`drop`) and flip one byte of the body of the
first `flip_gets` GET answers with a body; on the way out (`flip_puts`) the middle byte of
every PUT or POST body over 1,000 bytes, so a store that checks a body's checksum refuses
it every time. Requests whose method is in `.refuse` (a set the
test may change at any time) are answered `500 InternalError` without reaching the store.
It buffers whole bodies: for test-sized objects.
Use it as a context manager, or call `.close()`.
"""

from __future__ import annotations

import http.client
import http.server
import threading
from urllib.parse import urlsplit

# Headers describing one connection's framing: the proxy sets its own.
HOP = {"content-length", "transfer-encoding", "connection"}


class HttpProxy:
    def __init__(self, upstream: str, drop=(), flip_gets: int = 0, flip_puts: bool = False):
        target = urlsplit(upstream)
        dropped = {h.lower() for h in drop} | HOP
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self._lock = threading.Lock()
        self._sent = [0]
        self.refuse: set[str] = set()
        seen, lock, flips, sent, proxy = self.requests, self._lock, [flip_gets], self._sent, self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _forward(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                if flip_puts and body and self.command in ("PUT", "POST") and len(body) > 1000:
                    i = len(body) // 2
                    body = body[:i] + bytes([body[i] ^ 0x55]) + body[i + 1:]
                with lock:
                    seen.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
                    sent[0] += n
                if self.command in proxy.refuse:
                    err = b"<Error><Code>InternalError</Code><Message>refused by the test proxy</Message></Error>"
                    self.send_response(500)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(err)))
                    self.end_headers()
                    self.wfile.write(err)
                    return
                c = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
                c.request(self.command, self.path, body=body, headers=dict(self.headers.items()))
                r = c.getresponse()
                data = r.read()
                if self.command == "GET" and r.status in (200, 206) and data:
                    with lock:
                        flip, flips[0] = flips[0] > 0, flips[0] - 1
                    if flip:
                        data = bytes([data[0] ^ 0x55]) + data[1:]
                self.send_response(r.status)
                for k, v in r.getheaders():
                    if k.lower() not in dropped:
                        self.send_header(k, v)
                # A HEAD's answer has no body but the object's length.
                self.send_header("Content-Length",
                                 r.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                c.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _forward

        class Server(http.server.ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                pass  # a client hanging up mid-request (bucketfs after a refused upload) is expected

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def take(self) -> list[tuple[str, str, dict[str, str]]]:
        """The requests seen since the last take, oldest first."""
        with self._lock:
            out = list(self.requests)
            self.requests.clear()
        return out

    @property
    def sent(self) -> int:
        """Request body bytes forwarded so far."""
        with self._lock:
            return self._sent[0]

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> HttpProxy:
        return self

    def __exit__(self, *exc):
        self.close()


class CutProxy:
    """A TCP proxy that cuts connections in mid-request, as a network failure would.

    `CutProxy(upstream_port)` listens on a free loopback port (`.url`). After
    `.arm(pattern, after, times)`, the next `times` connections whose client bytes contain
    `pattern` are closed both ways once `after` more client bytes have gone up; `.cuts`
    counts them. Anything else is forwarded as it comes.

    `.hold(pattern)` instead keeps the next request containing `pattern` from the server,
    unanswered (the client times out and gives up): once the client has closed and
    `.release()` is called, the request is sent to the server on a new connection, as a
    network that held it would deliver it late. `.held` counts them; `.landed` is set once
    the server answered the late one.
    """

    def __init__(self, upstream_port: int):
        import socket
        self._upstream = upstream_port
        self._lock = threading.Lock()
        self._armed: tuple[bytes, int, int] | None = None
        self.cuts = 0
        self._srv = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._srv.getsockname()[1]}"
        self._closed = False
        self._hold: bytes | None = None
        self.held = 0
        self._release = threading.Event()
        self.landed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def hold(self, pattern: str) -> None:
        with self._lock:
            self._hold = pattern.encode()
            self.held = 0
            self._release.clear()
            self.landed.clear()

    def release(self) -> None:
        self._release.set()

    def _take_hold(self, seen: bytes) -> bool:
        with self._lock:
            if self._hold is None or self._hold not in seen:
                return False
            self._hold = None
            self.held += 1
            return True

    def _deliver_late(self, request: bytes) -> None:
        import socket
        self._release.wait(300)
        with socket.create_connection(("127.0.0.1", self._upstream)) as up:
            up.sendall(request)
            up.settimeout(30)
            try:
                up.recv(65536)  # the server answers once it has done the request
            except OSError:
                pass
        self.landed.set()

    def arm(self, pattern: str, after: int, times: int = 1) -> None:
        with self._lock:
            self._armed = (pattern.encode(), after, times)
            self.cuts = 0

    def _take(self, seen: bytes) -> int | None:
        """Bytes to let through before cutting this connection, if it is to be cut."""
        with self._lock:
            if self._armed is None or self._armed[0] not in seen:
                return None
            pattern, after, times = self._armed
            self._armed = (pattern, after, times - 1) if times > 1 else None
            self.cuts += 1
            return after

    def _accept(self):
        import socket
        while not self._closed:
            try:
                client, _ = self._srv.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", self._upstream))
            threading.Thread(target=self._pipe_up, args=(client, up), daemon=True).start()
            threading.Thread(target=self._pipe_down, args=(up, client), daemon=True).start()

    def _pipe_up(self, client, up):
        tail, left, held = b"", None, None
        try:
            while True:
                d = client.recv(65536)
                if not d:
                    break
                if held is not None:
                    held.append(d)
                    continue
                if left is None:
                    tail = (tail + d)[-8192:]
                    if self._take_hold(d):
                        held = [d]
                        continue
                    left = self._take(tail)
                if left is not None:
                    if len(d) >= left:
                        up.sendall(d[:left])
                        break
                    left -= len(d)
                up.sendall(d)
        except OSError:
            pass
        for s in (up, client):
            try:
                s.shutdown(2)
            except OSError:
                pass
            s.close()
        if held is not None:
            threading.Thread(target=self._deliver_late, args=(b"".join(held),), daemon=True).start()

    def _pipe_down(self, up, client):
        try:
            while True:
                d = up.recv(65536)
                if not d:
                    break
                client.sendall(d)
        except OSError:
            pass

    def close(self):
        self._closed = True
        self._srv.close()

    def __enter__(self) -> CutProxy:
        return self

    def __exit__(self, *exc):
        self.close()
