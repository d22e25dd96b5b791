"""deploy/prometheus: the alerting rules pass `promtool check rules`, fire as tests/monitoring/alerts_test.yml
expects (`promtool test rules`), and the example configuration passes `promtool check config`. promtool
comes with Debian's `prometheus` package, which `make peers` installs."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yml"
CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.yml"


def promtool(*args: str, cwd: Path | None = None) -> str:
    tool = shutil.which("promtool")
    assert tool, "promtool is missing: install Debian's prometheus package (`make peers` does)."
    done = subprocess.run([tool, *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_the_alerting_rules_pass_promtool_check():
    out = promtool("check", "rules", str(RULES))
    assert "SUCCESS: 3 rules found" in out


def test_the_alerts_fire_for_an_offline_worker_and_a_stuck_queue_and_stay_quiet_otherwise():
    assert "SUCCESS" in promtool("test", "rules", "alerts_test.yml", cwd=Path(__file__).parent)


def test_the_example_scrape_configuration_passes_promtool_check(tmp_path):
    # promtool checks that the token file exists: the example names the production path.
    token = tmp_path / "mado-metrics-token"
    token.write_text("mmt_example\n")
    text = CONFIG.read_text()
    assert "/etc/prometheus/mado-metrics-token" in text
    (tmp_path / "prometheus.yml").write_text(text.replace("/etc/prometheus/mado-metrics-token", str(token)))
    shutil.copy(RULES, tmp_path / "alerts.yml")
    out = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert "SUCCESS: 3 rules found" in out
