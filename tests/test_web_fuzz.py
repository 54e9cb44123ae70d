"""Fuzz the page's JSON API with schemathesis against its own /openapi.json: no server
error and no response that breaks the spec, as an anonymous client and as a signed-in
operator (whose toggles really reach the store)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from runnerctl.sim.world import World
from runnerctl.web.auth import add_user
from tests.test_web import PASSWORD, _client, _sign_in, _world

EXAMPLES = 50
"""Per operation; the whole file stays well under a minute on a shared 2-core machine."""


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[World, dict[str, str]]]:
    state = Path(tmp_path_factory.mktemp("fuzz"))
    world = _world(state)
    add_user(world.store, "olga", PASSWORD, "operator")
    world.submit(4, 3600.0)
    world.gpus.foreign[7] = (4242, "alice")
    world.advance(10.0)
    client = _client(world, state)
    _, csrf = _sign_in(client, "olga")
    cookie = "; ".join(f"{name}={value}" for name, value in client.cookies.items())
    yield world, {"Cookie": cookie, "X-CSRF-Token": csrf}
    world.close()


def _schema(world: World, tmp: Path) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_asgi("/openapi.json", _client(world, tmp).app)


@pytest.mark.parametrize("signed_in", [False, True], ids=["anonymous", "operator"])
def test_api_keeps_its_spec(fuzzed: tuple[World, dict[str, str]], signed_in: bool, tmp_path: Path) -> None:
    world, headers = fuzzed
    schema = _schema(world, tmp_path)
    operations = [op.ok() for op in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/api/host", "/api/events", "/api/toggles", "/api/session"}
    seen: dict[int, int] = {}
    for operation in operations:
        @settings(max_examples=EXAMPLES, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy())
        def run(case: schemathesis.Case) -> None:
            response = case.call_and_validate(headers=headers if signed_in else None)
            seen[response.status_code] = seen.get(response.status_code, 0) + 1
            assert response.status_code < 500

        run()
    assert 200 in seen
    toggles = world.store.toggles(world.controller.host)
    if signed_in:
        assert 200 in seen and (toggles or any(e.kind == "resume" for e in world.store.events("demo")))
