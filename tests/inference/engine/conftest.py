"""The reference engine's tiny families for the engine tests (tests/support/tiny_families.py).

A test that asks for `tiny`, itself or through a fixture built on it, runs once per family,
Qwen2.5-Omni and Qwen3-Omni (ids `[qwen2.5]`, `[qwen3]`); `@one_family(model, reason)` keeps
a test on one. `tiny` is module-scoped: pytest runs a module's tests family by family, so a
module's engines on one family start once and are gone before the other's start.
"""

from __future__ import annotations

import pytest

from inference.engine.reference.reply import Reply
from tests.support.tiny_families import TINY_FAMILIES, TinyModels


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "one_family(model, reason): run the test on that tiny family only "
                                       "(tests/support/tiny_families.py)")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "tiny" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("one_family")
    # by model name: a hashable parameter, so pytest groups a module's tests by family
    models = [marker.args[0]] if marker else list(TINY_FAMILIES)
    metafunc.parametrize("tiny", models, ids=[TINY_FAMILIES[model].id for model in models], indirect=True,
                         scope="module")


@pytest.fixture(scope="module")
def tiny(request):
    """The tiny family this test runs on (a `TinyFamily`)."""
    return TINY_FAMILIES[request.param]


@pytest.fixture(scope="session")
def tiny_models() -> TinyModels:
    """The tiny models, each loaded once for the session."""
    return TinyModels()


@pytest.fixture
def codes_by_request(monkeypatch) -> dict[str, list[list[int]]]:
    """Every talker frame (its codes) each request's reply made, by request id."""
    frames: dict[str, list[list[int]]] = {}
    original = Reply.after_talker_frame

    def record(self, frame):
        frames.setdefault(self.request.request_id, []).append(list(frame))
        return original(self, frame)

    monkeypatch.setattr(Reply, "after_talker_frame", record)
    return frames
