"""The shipped alert rules and dashboard: valid for Prometheus, and about metrics we export."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest

from syncd.ops.metrics import StatusCollector

MONITORING = Path(__file__).parents[2] / "monitoring"
RULES = MONITORING / "syncd.rules.yml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
_NAME = re.compile(r"\b((?:syncd|process)_[a-z_]+)")


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:  # tests/run.sh installs Debian's prometheus package, which has it
        pytest.skip("promtool is not installed (Debian package prometheus)")
    return found


def test_rules_pass_promtool_check() -> None:
    run = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS" in run.stdout


def test_rules_fire_as_intended() -> None:
    run = subprocess.run([promtool(), "test", "rules", "syncd.rules.test.yml"],
                         capture_output=True, text=True, timeout=60, cwd=MONITORING)
    assert run.returncode == 0, run.stdout + run.stderr


def exported_names() -> set[str]:
    peer = {"size": 1, "state": "in_sync", "frozen": None, "online": True, "lag_bytes": 0,
            "lag_seconds": 0.0}
    status = {
        "connected": True, "rejected_frames": 0, "reconnects": 0,
        "peers": {"b": {"online": True}},
        "files": [{"key": "k", "file": "f", "size": 1, "state": "in_sync", "ready": True,
                   "peers": {"b": peer}, "diverged": {}, "shipped_bytes": 1,
                   "shipped_frames": 1, "applied_bytes": 0, "applied_frames": 0,
                   "served_bytes": 0, "served_frames": 0}],
        "telemetry": {"frames": [["sent", "live", 1]], "bytes": [["sent", "live", 9]],
                      "rejected": {}, "latency": {"b": {"buckets": [["+Inf", 1]], "sum": 0.1,
                                                        "count": 1}}},
    }
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StatusCollector(lambda: status))
    ProcessCollector(registry=registry)
    text = generate_latest(registry).decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines()
            if line and not line.startswith("#")}


def _unknown(exprs: list[str]) -> set[str]:
    names = exported_names()
    used = {m for e in exprs for m in _NAME.findall(e)}
    assert used, "no syncd metric found in the expressions"
    return used - names


def test_rules_use_only_exported_metrics() -> None:
    exprs = re.findall(r"expr: (.*(?:\n {10,}.*)*)", RULES.read_text())
    assert len(exprs) >= 10
    assert _unknown(exprs) == set()


def test_dashboard_uses_only_exported_metrics() -> None:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert _unknown(exprs) == set()
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
