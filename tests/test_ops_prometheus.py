"""Prometheus alert rules (ops/prometheus) and the Grafana dashboard (ops/grafana): rules checked
and unit-tested by ``promtool`` (Debian package ``prometheus``, installed by .ci/run); every
query of the rules and the dashboard parsed by promtool and its metric names checked against the
metrics table of ops/README.md."""
from __future__ import annotations

import json
import re
import shutil

import pytest
import yaml

from tests.opsutil import REPO, metrics_table, promql_metric_names, run, table_name, tool

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
    p = run([tool("promtool"), "check", "rules", str(PROM / "alerts.yaml")])
    assert p.returncode == 0, p.stdout + p.stderr


def test_promtool_unit_tests():
    p = run([tool("promtool"), "test", "rules", str(PROM / "alerts_test.yaml")])
    assert p.returncode == 0 and "SUCCESS" in p.stdout + p.stderr, p.stdout + p.stderr


def test_promtool_unit_tests_catch_a_changed_threshold(tmp_path):
    shutil.copy(PROM / "alerts_test.yaml", tmp_path)
    (tmp_path / "alerts.yaml").write_text((PROM / "alerts.yaml").read_text().replace("> 1000", "> 5000"))
    p = run([tool("promtool"), "test", "rules", str(tmp_path / "alerts_test.yaml")])
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


def test_dashboard_queries_parse(tmp_path):
    queries = _grafana_queries()
    assert len(queries) >= 10
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:q{i}", "expr": _substitute(e)} for i, (_, e) in enumerate(queries)]}]}
    f = tmp_path / "dashboard_rules.yaml"
    f.write_text(yaml.safe_dump(rules))
    p = run([tool("promtool"), "check", "rules", str(f)])
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
    p = run([tool("promtool"), "check", "config", str(PROM / "prometheus.yml")])
    assert p.returncode == 0 and "1 rule files found" in p.stdout + p.stderr, p.stdout + p.stderr
