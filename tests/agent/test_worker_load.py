"""The agent's load is the omni worker's: sessions in use over capacity, full when it cannot answer."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agent.worker_load import OmniWorkerLoad, load_from_health


class FakeHealth:
    """A real HTTP server that answers GET /health with whatever the test sets."""

    def __init__(self) -> None:
        self.status = 200
        self.body: dict = {}
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                payload = json.dumps(owner.body).encode()
                self.send_response(owner.status if self.path == "/health" else 404)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/health"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def health() -> Iterator[FakeHealth]:
    fake = FakeHealth()
    yield fake
    fake.server.shutdown()


def test_load_is_the_share_of_sessions_in_use(health: FakeHealth) -> None:
    load = OmniWorkerLoad(health.url)
    health.body = {"status": "ready", "sessions": 4, "capacity": 16}
    assert load() == 0.25
    health.body = {"status": "ready", "sessions": 16, "capacity": 16}
    assert load() == 1.0


def test_a_loading_worker_is_full(health: FakeHealth) -> None:
    health.status = 503
    health.body = {"status": "loading", "sessions": 0, "capacity": 16}
    assert OmniWorkerLoad(health.url)() == 1.0


def test_an_unreachable_worker_is_full(health: FakeHealth) -> None:
    url = health.url
    health.server.shutdown()
    health.server.server_close()
    assert OmniWorkerLoad(url, timeout_s=0.5)() == 1.0


@pytest.mark.parametrize(("body", "expected"), [
    ({"sessions": 0, "capacity": 8}, 0.0),
    ({"sessions": 20, "capacity": 16}, 1.0),  # over capacity never reads as room to spare
    ({"sessions": 1, "capacity": 0}, 1.0),
    ({"sessions": "x", "capacity": 16}, 1.0),
    ({"status": "ready"}, 1.0),
])
def test_odd_health_bodies_never_invite_more_calls(body: dict, expected: float) -> None:
    assert load_from_health(body) == expected
