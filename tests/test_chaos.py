"""The chaos suite at its reduced size (``tests/chaos``): each scenario starts its own embedded
broker, Redis server(s) and worker subprocesses, injects its fault and asserts the invariants;
the figures are printed (``-s``). Full sizes: ``python -m tests.chaos --full``. The rolling
upgrade / rollback scenarios (``tests/chaos/rolling.py``) alone: ``-k rolling``."""
from __future__ import annotations

import json
import shutil

import pytest

from tests.chaos.releases import NotAGitCheckout
from tests.chaos.rolling import ROLLING
from tests.chaos.scenarios import SCENARIOS

pytestmark = [pytest.mark.kafka, pytest.mark.redis, pytest.mark.chaos]
ALL = {**SCENARIOS, **ROLLING}


@pytest.mark.parametrize("name", list(ALL))
def test_chaos(name):
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server not installed (.ci/run installs it)")
    try:
        figs = ALL[name]("reduced")
    except NotAGitCheckout as e:  # (an sdist: no previous release to roll from)
        pytest.skip(str(e))
    print("\nchaos " + json.dumps(figs))
