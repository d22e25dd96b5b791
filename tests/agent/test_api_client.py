"""The worker's HTTP client against a small scripted server: only what the real server cannot be
made to do on demand (fail with 5xx, stall, redirect). Everything else is tested against the real
server in test_end_to_end.py and test_cli_server.py."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from worker_agent.api import ApiClient, ApiError, ApiUnavailable, Backoff, FatalApiError

TOKEN = "mmt_SeCrEtSeCrEtSeCrEtSeCrEtSeCrEt0123456789x"


class Script:
    def __init__(self):
        self.answers: list[tuple[int, dict | None, dict]] = []
        self.requests: list[dict] = []


@pytest.fixture
def server():
    script = Script()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            script.requests.append({"method": self.command, "path": self.path, "body": body,
                                    "auth": self.headers.get("Authorization")})
            status, payload, headers = script.answers.pop(0) if script.answers else (200, {"ok": True}, {})
            if headers.get("sleep"):
                time.sleep(headers["sleep"])
            data = json.dumps(payload).encode() if payload is not None else b"<html>oops</html>"
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if headers.get("location"):
                self.send_header("Location", headers["location"])
            self.end_headers()
            try:
                self.wfile.write(data)
            except BrokenPipeError:
                pass  # the client gave up waiting (the timeout test)

        do_GET = do_POST = _answer

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    script.url = f"http://127.0.0.1:{httpd.server_port}"
    yield script
    httpd.shutdown()


def client(server, **kwargs) -> tuple[ApiClient, list[float]]:
    slept: list[float] = []
    return ApiClient(server.url, TOKEN, sleep=slept.append, **kwargs), slept


def test_server_errors_are_retried_with_growing_jittered_delays(server):
    server.answers = [(502, None, {}), (503, {"error": "busy", "code": "busy"}, {}), (500, None, {}),
                      (200, {"worker_id": "w", "online": True}, {})]
    api, slept = client(server, backoff=Backoff(base=1.0, cap=30.0))
    assert api.hello({"worker_id": "w"})["online"] is True
    assert len(server.requests) == 4 and all(r["auth"] == f"Bearer {TOKEN}" for r in server.requests)
    assert 0.5 <= slept[0] <= 1.0 and 1.0 <= slept[1] <= 2.0 and 2.0 <= slept[2] <= 4.0


def test_the_server_staying_down_raises_unavailable_after_the_attempts(server):
    server.answers = [(503, None, {})] * 3
    api, slept = client(server, attempts=3)
    with pytest.raises(ApiUnavailable, match="answered 503"):
        api.claim_check("w", 0)
    assert len(slept) == 2


def test_a_stalled_answer_is_a_timeout_and_retried(server, monkeypatch):
    monkeypatch.setattr("worker_agent.api.READ_TIMEOUT", 0.3)
    server.answers = [(200, {"item": None}, {"sleep": 1.0}), (200, {"item": {"id": 4}}, {})]
    api, slept = client(server)
    assert api.claim_read("w", 0) == {"id": 4} and len(slept) == 1


def test_an_unreachable_server_names_the_address_and_not_the_token():
    api = ApiClient("http://127.0.0.1:9", TOKEN, attempts=2, sleep=lambda s: None)
    with pytest.raises(ApiUnavailable) as caught:
        api.health()
    assert "http://127.0.0.1:9" in str(caught.value) and "MMT_API_URL" in str(caught.value)


def test_401_is_fatal_and_says_what_to_do(server):
    server.answers = [(401, {"error": f"Token {TOKEN} is revoked.", "code": "authentication_failed"}, {})]
    api, slept = client(server)
    with pytest.raises(FatalApiError) as caught:
        api.hello({})
    message = str(caught.value)
    assert "rejected the worker token (401)" in message and "install" in message
    assert TOKEN not in message and TOKEN[:12] + "…" in message
    assert slept == [], "401 is never retried"


def test_403_on_a_worker_endpoint_names_the_missing_scope(server):
    server.answers = [(403, {"error": "Needs worker:execute.", "code": "missing_scope"}, {})]
    api, _ = client(server)
    with pytest.raises(FatalApiError, match="lacks the worker:execute scope") as caught:
        api.claim_check("w", 5)
    assert caught.value.code == "missing_scope"
    assert server.requests[0]["body"] == {"worker_id": "w", "wait": 5}


def test_other_client_errors_carry_the_servers_code_and_are_not_retried(server):
    server.answers = [(409, {"error": "This lease is not the check's current lease.", "code": "invalid_lease"}, {})]
    api, slept = client(server)
    with pytest.raises(ApiError) as caught:
        api.complete_check(3, "w", "lease", "succeeded", {"items": []})
    assert (caught.value.status, caught.value.code) == (409, "invalid_lease") and slept == []
    assert server.requests[0]["path"] == "/api/worker/checks/3/complete"
    assert server.requests[0]["body"] == {"worker_id": "w", "lease_id": "lease", "status": "succeeded",
                                          "result": {"items": []}}


def test_redirects_are_not_followed(server):
    server.answers = [(301, {}, {"location": "https://elsewhere.example/api/worker/hello"})]
    api, _ = client(server)
    with pytest.raises(ApiError, match="redirected") as caught:
        api.hello({})
    assert len(server.requests) == 1 and caught.value.code == "redirect"


def test_the_health_call_sends_no_token(server):
    server.answers = [(200, {"status": "ok", "version": "0.1.0"}, {})]
    api, _ = client(server)
    assert api.health()["status"] == "ok" and server.requests[0]["auth"] is None


def test_the_wait_of_a_long_poll_is_bounded(server):
    api, _ = client(server)
    api.claim_check("w", 99)
    api.claim_read("w", -3)
    assert [r["body"]["wait"] for r in server.requests] == [30, 0]
