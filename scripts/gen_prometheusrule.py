#!/usr/bin/env python3
"""Write deploy/kubernetes/monitoring/prometheusrule.yaml from deploy/prometheus/weightd-alerts.yml.

The rule file is the one source: the PrometheusRule is its ``groups:`` indented under ``spec:``, text
for text (comments and block scalars kept), so the two cannot drift. ``--check``: exit 1 when the file
on disk is not what this would write (tests/test_deploy.py runs the same comparison).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "deploy/prometheus/weightd-alerts.yml"
OUT = ROOT / "deploy/kubernetes/monitoring/prometheusrule.yaml"

HEADER = """\
# GENERATED from deploy/prometheus/weightd-alerts.yml by scripts/gen_prometheusrule.py: edit that file,
# then run the script (a test fails when the two differ).
# Prometheus Operator (monitoring.coreos.com/v1). kube-prometheus-stack selects rules by the release
# label: monitoring/kustomization.yaml sets it (README "Metrics and alerts").
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: weightd
  namespace: weightd
  labels: {app.kubernetes.io/name: weightd}
spec:
"""


def render(rules_text: str) -> str:
    lines = rules_text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("groups:"))
    body = [("  " + ln) if ln.strip() else "" for ln in lines[start:]]
    return HEADER + "\n".join(body) + "\n"


def main(argv: list[str]) -> int:
    want = render(RULES.read_text())
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text() != want:
            print(f"{OUT.relative_to(ROOT)} differs from {RULES.relative_to(ROOT)}: run "
                  f"python3 scripts/gen_prometheusrule.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(want)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
