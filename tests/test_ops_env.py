"""The environment that compose.yaml and ops/k8s give the workers means something: every
``DERENDER_*`` variable is the one a ``derender-worker run`` flag reads (``worker.flags``), and
its value converts as the flag's own would. A renamed flag fails here instead of being ignored in
a deployment."""
from __future__ import annotations

import pytest

from tests.opsutil import REPO, load_yaml_docs
from worker.cli import _build_parser
from worker.flags import env_value, env_vars

NON_FLAG = {"KAFKA_BOOTSTRAP_SERVERS"}  # read by --bootstrap-servers besides its DERENDER_ variable


def _run_flags() -> dict:
    _, subs = _build_parser()
    return {var: a for a in subs["run"]._actions if a.option_strings for var in env_vars(a)}


def _deployments() -> list[tuple[str, dict[str, str]]]:
    import yaml
    out = []
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())
    for name, svc in compose["services"].items():
        if svc.get("command", [None])[0] == "run":
            out.append((f"compose:{name}", {k: str(v) for k, v in svc["environment"].items()}))
    for doc in load_yaml_docs(REPO / "ops" / "k8s" / "deployment.yaml"):
        for c in doc["spec"]["template"]["spec"]["containers"]:
            # a variable from a Secret (valueFrom) must name a flag too (its value, unknown here, checked as "")
            out.append((f"k8s:{c['name']}", {e["name"]: e.get("value", "") for e in c["env"]}))
    return out


@pytest.mark.parametrize("where,env", _deployments(), ids=lambda v: v if isinstance(v, str) else "")
def test_deployment_env_names_real_flags(where, env):
    flags = _run_flags()
    for var, raw in env.items():
        if var in NON_FLAG:
            continue
        assert var in flags, f"{where}: {var} is read by no `derender-worker run` flag"
        env_value(flags[var], raw)  # raises ValueError on a value the flag would refuse
    assert env["DERENDER_METRICS_PORT"] and "DERENDER_DRAIN_TIMEOUT" in env


def test_a_wrong_name_is_caught():
    assert "DERENDER_DRAIN_TIMEOUT" in _run_flags() and "DERENDER_DRAIN_TIMEOUT_S" not in _run_flags()
