"""``hpctrain report RUN --serve``: the report, live, on 127.0.0.1 only, behind a random token in the URL.

Read-only: GET and HEAD of the page, nothing else; any path without the token is refused (403) — a browser on
this machine gets the URL from the terminal, another user on a shared login node does not. The page reloads itself
every ``refresh_s`` seconds while the run goes on; the report is rebuilt at most once per refresh (a remote run's
files that changed are fetched again, the scheduler is polled for a registered one). When the run has ended the
final report is written to disk, the page stops reloading, and the server stops by itself ``linger_s`` later. A
rebuild that fails (a file the report refuses, a login node gone) stops it too, and ``serve`` raises that error.
A client that drops its connection is no error of the server: nothing is printed for it.
"""

from __future__ import annotations

import hmac
import secrets
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from hpctrain.errors import HpctrainError
from hpctrain.report.build import build_report, report_data
from hpctrain.report.collect import ReportData
from hpctrain.report.html import page
from hpctrain.report.source import RunSource

HOST = "127.0.0.1"
REFRESH_S = 5.0


def run_ended(data: ReportData, registered: bool) -> bool:
    """A registered run: its state says so. A bare directory: its final record or a failure note is there."""
    if registered:
        return data.facts.ended
    return data.final is not None or bool(data.failure)


class LiveReport:
    """The newest page, rebuilt from the run's files at most once per ``refresh_s``."""

    def __init__(self, source: RunSource, refresh_s: float, extra_dirs: tuple[Path, ...] = ()) -> None:
        self.source, self.refresh_s, self.extra_dirs = source, refresh_s, extra_dirs
        self._lock = threading.Lock()
        self._built = -float("inf")
        self._page = b""
        self.ended = False
        self.builds = 0
        self.error: HpctrainError | None = None  # why the last rebuild failed; the page stays the one before

    def current(self) -> bytes:
        with self._lock:
            if not self.ended and time.monotonic() - self._built >= self.refresh_s:
                try:
                    self._rebuild()
                except HpctrainError as exc:
                    self.error, self.ended = exc, True
            return self._page

    def _rebuild(self) -> None:
        if self.builds:
            self.source.refresh(poll=True)
        data = report_data(self.source, self.extra_dirs)
        self.ended = run_ended(data, self.source.run_id is not None)
        self._page = page(data, None if self.ended else self.refresh_s).encode("utf-8")
        self._built = time.monotonic()
        self.builds += 1


def _handler(token: str, live: LiveReport) -> type[BaseHTTPRequestHandler]:
    allowed = (f"/{token}/", f"/{token}/report.html")

    class Handler(BaseHTTPRequestHandler):
        server_version = "hpctrain-report"
        sys_version = ""

        def _answer(self, body: bool) -> None:
            if not any(hmac.compare_digest(self.path.encode(), p.encode()) for p in allowed):
                self.send_error(403, "this URL needs the token that hpctrain report printed")
                return
            content = live.current()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(content)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src data:")
            self.end_headers()
            if body:
                self.wfile.write(content)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self._answer(body=True)

        def do_HEAD(self) -> None:  # noqa: N802
            self._answer(body=False)

        def _refuse(self) -> None:
            self.send_error(405, "read-only: only GET and HEAD")

        do_POST = do_PUT = do_DELETE = do_PATCH = _refuse  # noqa: N815

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
            pass  # the terminal shows the URL and the end, not every reload

    return Handler


class QuietServer(ThreadingHTTPServer):
    """Serves each request on its own thread; a client that resets or drops its connection is not reported."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError | TimeoutError):
            return
        print(f"hpctrain report: a request failed: {error!r}", file=sys.stderr, flush=True)


class ReportServer:
    """Serves one run's live report until the run ends (then ``linger_s`` more) or ``stop()``."""

    def __init__(self, source: RunSource, *, port: int = 0, refresh_s: float = REFRESH_S,
                 extra_dirs: tuple[Path, ...] = (), out: Path | None = None, linger_s: float | None = None) -> None:
        self.token = secrets.token_urlsafe(24)
        self.live = LiveReport(source, refresh_s, extra_dirs)
        self.out, self.linger_s = out, (2 * refresh_s if linger_s is None else linger_s)
        self.httpd = QuietServer((HOST, port), _handler(self.token, self.live))
        self._stopped = threading.Event()

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}/{self.token}/"

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self, written: Callable[[Path], None]) -> None:
        """Rebuild every refresh until the run ends; write the final report; stop after the linger (or at once
        when a rebuild or the final report fails)."""
        try:
            while not self._stopped.is_set():
                self.live.current()
                if self.live.error is not None:
                    break
                if self.live.ended:
                    try:
                        path, _ = build_report(self.live.source, self.out, extra_dirs=self.live.extra_dirs)
                    except HpctrainError as exc:
                        self.live.error = exc
                        break
                    written(path)
                    self._stopped.wait(self.linger_s)
                    break
                self._stopped.wait(self.live.refresh_s)
        finally:
            self.httpd.shutdown()

    def serve(self, written: Callable[[Path], None] = lambda p: None) -> None:
        """Block until the run has ended (and the linger passed) or ``stop()`` was called; the error of a rebuild
        that failed is raised after the server has stopped."""
        watcher = threading.Thread(target=self._watch, args=(written,), daemon=True)
        watcher.start()
        try:
            self.httpd.serve_forever(poll_interval=0.2)
        finally:
            self._stopped.set()
            self.httpd.server_close()
            watcher.join(timeout=5)
        if self.live.error is not None:
            raise self.live.error
