"""A worker with small limits, shared by the fuzz and load tests (tiny-random, capacity 4).

The limits keep each reply cheap on a 2-core machine (4 output tokens, short conversations);
what the tests check does not depend on their size.
"""

from __future__ import annotations

import pytest

from tests.conftest import WorkerProcess

SMALL_LIMITS_CAPACITY = 4
SMALL_LIMITS = {
    "OMNI_LIMIT_MAX_EVENT_BYTES": "65536",
    "OMNI_LIMIT_MAX_OUTPUT_TOKENS": "4",
    "OMNI_LIMIT_MAX_CONVERSATION_ITEMS": "40",
    "OMNI_LIMIT_MAX_TEXT_CHARS": "2000",
    "OMNI_LIMIT_MAX_INSTRUCTIONS_CHARS": "2000",
    "OMNI_LIMIT_MAX_EVENT_AUDIO_S": "1",
    "OMNI_LIMIT_MAX_TURN_AUDIO_S": "2",
    "OMNI_LIMIT_MAX_CONVERSATION_AUDIO_S": "10",
    "OMNI_LIMIT_CLIENT_CONNECTION_BURST": "1000",
}


@pytest.fixture(scope="session")
def small_limits_worker(tmp_path_factory) -> WorkerProcess:
    w = WorkerProcess(tmp_path_factory.mktemp("small-limits"), api_key="small-limits-key",
                      args=("--max-sessions", str(SMALL_LIMITS_CAPACITY)), env=SMALL_LIMITS).start()
    yield w
    w.kill()
