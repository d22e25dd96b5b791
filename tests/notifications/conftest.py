"""Real peers for the notification tests: an SMTP server (aiosmtpd), an HTTP receiver for webhooks
(http.server in a thread) that verifies X-Mado-Signature, a TCP port that accepts and never answers,
and the periodic runner as its own process (`manage.py mado_periodic`) against the test database."""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.conf import settings as django_settings

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# -- SMTP -------------------------------------------------------------------------------------------

class SmtpServer:
    def __init__(self):
        from aiosmtpd.controller import Controller

        self.messages: list = []
        self.refuse_recipients = False
        self.lock = threading.Lock()
        server = self

        class Handler:
            async def handle_RCPT(self, smtp, session, envelope, address, rcpt_options):
                if server.refuse_recipients:
                    return "550 5.1.1 No such mailbox here"
                envelope.rcpt_tos.append(address)
                return "250 OK"

            async def handle_DATA(self, smtp, session, envelope):
                from email import message_from_bytes
                from email.policy import default

                with server.lock:
                    server.messages.append(message_from_bytes(envelope.content, policy=default))
                return "250 Message accepted"

        self.port = free_port()
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port)
        self.controller.start()

    def with_subject(self, text: str) -> list:
        with self.lock:
            return [m for m in self.messages if text in m["Subject"]]

    def stop(self):
        self.controller.stop()


@pytest.fixture
def smtp_server(settings):
    server = SmtpServer()
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", server.port
    yield server
    server.stop()


# -- webhooks ---------------------------------------------------------------------------------------

class Receiver:
    """Answers each POST with the next status of `answers` (then 200), verifying the signature of
    every body with `secret` (set once the rule exists)."""

    def __init__(self, answers=()):
        self.answers = list(answers)
        self.secret = ""
        self.requests: list[dict] = []  # every POST, in arrival order
        self.accepted: list[dict] = []  # payloads answered 2xx
        self.bad_signatures = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                expected = "sha256=" + hmac.new(receiver.secret.encode(), body, hashlib.sha256).hexdigest()
                good = hmac.compare_digest(expected, self.headers.get("X-Mado-Signature", ""))
                with receiver.lock:
                    payload = json.loads(body)
                    receiver.requests.append({"payload": payload, "headers": dict(self.headers), "signed": good})
                    if not good:
                        receiver.bad_signatures += 1
                        status = 401
                    else:
                        status = receiver.answers.pop(0) if receiver.answers else 200
                    if 200 <= status < 300:
                        receiver.accepted.append(payload)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/mado?token=in-the-path"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    made = []

    def make(answers=()):
        made.append(Receiver(answers))
        return made[-1]

    yield make
    for server in made:
        server.stop()


@pytest.fixture
def silent_port():
    """Accepts connections and never answers (a hung receiver)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    yield listener.getsockname()[1]
    listener.close()


# -- the periodic runner as its own process ---------------------------------------------------------

class PeriodicProcess:
    def __init__(self, tmp_path: Path, extra_env: dict):
        database = django_settings.DATABASES["default"]
        url = (f"postgres://{database['USER']}@{database['HOST'] or '127.0.0.1'}:{database['PORT'] or 5432}/"
               f"{database['NAME']}")
        env = {k: v for k, v in os.environ.items() if not k.startswith("MADO_")}
        env.update(MADO_DATABASE_URL=url, MADO_VAR_DIR=str(tmp_path / "var"), MADO_LOG_LEVEL="DEBUG",
                   **{k: str(v) for k, v in extra_env.items()})
        self.log = tmp_path / "periodic.log"
        self.log_file = open(self.log, "wb")
        self.process = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "mado_periodic"], cwd=ROOT, env=env,
                                        stdout=self.log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log_file.close()


@pytest.fixture
def periodic_process(tmp_path):
    started = []

    def start(**env):
        started.append(PeriodicProcess(tmp_path, env))
        return started[-1]

    yield start
    for process in started:
        process.stop()
