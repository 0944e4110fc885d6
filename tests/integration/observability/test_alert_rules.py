"""The alert rules with Prometheus's own tool: `promtool check rules` on the one rule file, and `promtool
test rules` (alerts.test.yaml): every alert fires on a recorded unhealthy series and stays quiet on a
healthy one. Skips, saying why, where promtool is missing (tools/observability installs it)."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
RULES = ROOT / "charts" / "hubshift" / "rules" / "hubshift.rules.yaml"
TESTS = Path(__file__).resolve().parent / "alerts.test.yaml"


def test_the_rule_file_is_valid(promtool: str) -> None:
    result = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_fires_on_an_unhealthy_series_and_stays_quiet_on_a_healthy_one(promtool: str) -> None:
    import yaml

    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    cases = yaml.safe_load(TESTS.read_text())["tests"]
    fired = {
        case["alertname"] for test in cases for case in test["alert_rule_test"] if case.get("exp_alerts")
    }
    assert fired == alerts, f"alerts without a firing case: {alerts - fired}"
    result = subprocess.run(
        [promtool, "test", "rules", TESTS.name],
        cwd=TESTS.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
