"""The chaos suite at its reduced size (``tests/chaos``): each scenario starts its own embedded
broker, Redis server(s) and worker subprocesses, injects its fault and asserts the invariants;
the figures are printed (``-s``). Full sizes: ``python -m tests.chaos --full``."""
from __future__ import annotations

import json
import shutil

import pytest

from tests.chaos.scenarios import SCENARIOS

pytestmark = [pytest.mark.kafka, pytest.mark.redis, pytest.mark.chaos]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_chaos(name):
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server not installed (.ci/run installs it)")
    figs = SCENARIOS[name]("reduced")
    print("\nchaos " + json.dumps(figs))
