"""Prometheus alert rules (ops/prometheus) and the Grafana dashboard (ops/grafana): rules checked
and unit-tested by ``promtool`` (Debian package ``prometheus``, installed by .ci/run; where it is
absent those tests skip with the reason, failing only in CI: ``opsutil.system_tool``); every
query of the rules and the dashboard parsed by promtool and by ``promql-parser`` (Python, the
``test`` extra: it runs everywhere) and its metric names checked against the metrics table of
ops/README.md."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import promql_parser
import pytest
import yaml

from tests.opsutil import REPO, metrics_table, promql_metric_names, run, system_tool, table_name

PROM = REPO / "ops" / "prometheus"
DASHBOARD = REPO / "ops" / "grafana" / "derender-worker.json"
TABLE = metrics_table()


def _alert_rules() -> list[dict]:
    return [r for g in yaml.safe_load((PROM / "alerts.yaml").read_text())["groups"] for r in g["rules"]]


def test_table_parses():
    assert "derender_records_processed_total" in TABLE
    assert TABLE["derender_records_processed_total"]["labels"]["outcome"] == ["ok", "error", "dead_letter", "duplicate"]
    assert TABLE["derender_consumer_lag"]["labels"] == {"topic": None, "partition": None}
    for name, m in TABLE.items():
        assert m["type"] in {"counter", "gauge", "histogram"}, name
        assert name.endswith("_total") == (m["type"] == "counter"), name  # Prometheus naming
        if m["type"] == "histogram":
            assert name.endswith("_seconds"), name  # base unit


def test_promql_names_parser():
    assert promql_metric_names(
        'histogram_quantile(0.99, sum by (le, mode) (rate(a_seconds_bucket{mode="x",le!="1"}[5m]))) > 10 '
        'unless on () sum(rate(b_total[5m])) > 0 and c') == {"a_seconds_bucket", "b_total", "c"}


def test_promtool_check_rules():
    p = run([system_tool("promtool"), "check", "rules", str(PROM / "alerts.yaml")])
    assert p.returncode == 0, p.stdout + p.stderr


def test_promtool_unit_tests():
    p = run([system_tool("promtool"), "test", "rules", str(PROM / "alerts_test.yaml")])
    assert p.returncode == 0 and "SUCCESS" in p.stdout + p.stderr, p.stdout + p.stderr


def test_promtool_unit_tests_catch_a_changed_threshold(tmp_path):
    shutil.copy(PROM / "alerts_test.yaml", tmp_path)
    (tmp_path / "alerts.yaml").write_text((PROM / "alerts.yaml").read_text().replace("> 1000", "> 5000"))
    p = run([system_tool("promtool"), "test", "rules", str(tmp_path / "alerts_test.yaml")])
    assert p.returncode != 0 and "DerenderConsumerLagHigh" in p.stdout + p.stderr


def test_every_alert_has_a_firing_unit_test():
    tests = yaml.safe_load((PROM / "alerts_test.yaml").read_text())["tests"]
    fired = {t["alertname"] for g in tests for t in g.get("alert_rule_test", []) if t.get("exp_alerts")}
    quiet = {t["alertname"] for g in tests for t in g.get("alert_rule_test", []) if not t.get("exp_alerts")}
    names = {r["alert"] for r in _alert_rules()}
    assert names == fired
    assert names == quiet  # and a case where it stays silent


def test_alert_rules_use_table_metrics():
    for r in _alert_rules():
        for n in promql_metric_names(r["expr"]):
            assert table_name(n, TABLE), f"{r['alert']}: {n} is not in the metrics table"
        assert r["labels"]["severity"] in {"warning", "critical"}
        assert r["annotations"]["summary"] and r["annotations"]["description"]


def _grafana_queries() -> list[tuple[str, str]]:
    d = json.loads(DASHBOARD.read_text())
    out = [(p["title"], t["expr"]) for p in d["panels"] for t in p.get("targets", [])]
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", q)
            assert m, q
            out.append((f"variable {v['name']}", m.group(1)))
    return out


def _substitute(expr: str) -> str:
    """Grafana's variables replaced by values Prometheus accepts."""
    return (expr.replace("$__rate_interval", "5m").replace("$__range", "1h").replace("$__interval", "1m")
            .replace("$instance", ".*"))


def test_promtool_parses_dashboard_queries(tmp_path):
    queries = _grafana_queries()
    assert len(queries) >= 10
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:q{i}", "expr": _substitute(e)} for i, (_, e) in enumerate(queries)]}]}
    f = tmp_path / "dashboard_rules.yaml"
    f.write_text(yaml.safe_dump(rules))
    p = run([system_tool("promtool"), "check", "rules", str(f)])
    assert p.returncode == 0, p.stdout + p.stderr
    assert "$" not in f.read_text()


def test_dashboard_uses_only_table_metrics_and_covers_them():
    used = set()
    for title, expr in _grafana_queries():
        names = promql_metric_names(_substitute(expr))
        assert names, title
        for n in names:
            base = table_name(n, TABLE)
            assert base, f"panel {title!r}: {n} is not in the metrics table"
            used.add(base)
    assert used == set(TABLE), f"metrics without a panel: {sorted(set(TABLE) - used)}"


@pytest.mark.parametrize("bad", ["derender_messages_total", "derender_seconds_bucket", "up"])
def test_unknown_metric_is_caught(bad):
    assert table_name(bad, TABLE) is None


def test_promtool_check_config():
    """The Compose pipeline's Prometheus config (its rule file is alerts.yaml, relative path)."""
    p = run([system_tool("promtool"), "check", "config", str(PROM / "prometheus.yml")])
    assert p.returncode == 0 and "1 rule files found" in p.stdout + p.stderr, p.stdout + p.stderr


# ------------------------------------------------------------------- the same, in Python ----
def _selector_names(expr: str) -> set[str]:
    names: set[str] = set()
    promql_parser.walk(promql_parser.parse(expr),
                       lambda n: names.add(n.name) if isinstance(n, promql_parser.VectorSelector) and n.name else None)
    return names


def test_alert_rules_parse_in_python():
    """Every alert expression is valid PromQL (syntax, function names and argument types), and
    the metric names the regular-expression reader finds are the parser's."""
    rules = _alert_rules()
    assert rules
    for r in rules:
        assert set(r) <= {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}, r["alert"]
        if "for" in r:
            promql_parser.parse_duration(r["for"])
        assert _selector_names(r["expr"]) == promql_metric_names(r["expr"]), r["alert"]


def test_dashboard_queries_parse_in_python():
    for title, expr in _grafana_queries():
        assert _selector_names(_substitute(expr)) == promql_metric_names(_substitute(expr)), title


@pytest.mark.parametrize("bad", ["sum(rate(derender_records_processed_total[5m])",   # unclosed
                                 "rate(derender_records_processed_total)",           # not a range
                                 "histogram_quantil(0.9, derender_derender_seconds_bucket)"])
def test_python_parser_rejects_bad_promql(bad):
    with pytest.raises(ValueError):
        promql_parser.parse(bad)


def test_a_run_without_promtool_skips_with_the_reason_and_fails_in_ci(tmp_path):
    """This file run where promtool cannot be found (PATH = the interpreter's folder only): the
    promtool tests skip, each naming promtool and how to install it, every other test passes; with
    ``CI=true`` the same run fails them instead."""
    here = Path(sys.executable).parent
    if (here / "promtool").is_file():
        pytest.skip(f"promtool is installed beside the interpreter ({here}): it cannot be hidden from this run")
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env |= {"PATH": str(here), "PYTHONPATH": str(REPO)}
    me = f"tests/test_ops_prometheus.py::{test_a_run_without_promtool_skips_with_the_reason_and_fails_in_ci.__name__}"
    argv = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests/test_ops_prometheus.py",
            "--deselect", me]
    p = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    promtool_tests = [n for n in globals() if n.startswith("test_promtool_")]
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
    summary = p.stdout.strip().splitlines()[-1]
    assert re.search(rf"\b\d+ passed, {len(promtool_tests)} skipped\b", summary), p.stdout[-3000:]
    skips = re.findall(r"^SKIPPED \[(\d+)\] (.*)$", p.stdout, flags=re.M)  # -rs: one line per reason
    assert sum(int(n) for n, _ in skips) == len(promtool_tests) and all(
        "promtool not found" in why and "apt-get install prometheus" in why for _, why in skips), skips
    p = subprocess.run(argv, cwd=REPO, env=env | {"CI": "true"}, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1 and f"{len(promtool_tests)} failed" in p.stdout.strip().splitlines()[-1], p.stdout[-3000:]
