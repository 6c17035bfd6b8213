"""The files under deploy/ as a platform team applies them: the alert rules fire with the labels the
shipped PodMonitor gives (real ``promtool test rules``), the PrometheusRule is the rule file, the
monitoring kustomization carries the label kube-prometheus-stack selects on, ``kubectl apply -k
deploy/kubernetes`` deploys no example workload, and no two hostNetwork pods share a host port."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
KDIR = ROOT / "deploy/kubernetes"
RULES = ROOT / "deploy/prometheus/weightd-alerts.yml"
MONITORING = KDIR / "monitoring"


def promtool() -> str | None:
    local = ROOT / "tools/bin/promtool"
    return str(local) if local.exists() else shutil.which("promtool")


needs_promtool = pytest.mark.skipif(promtool() is None, reason="promtool not installed (bash scripts/install-tools.sh)")
needs_kubectl = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")


def docs_of(*files: Path) -> list[dict]:
    return [d for f in files for d in yaml.safe_load_all(f.read_text()) if d]


def kustomization_docs(kdir: Path) -> list[dict]:
    """What ``kubectl apply -k kdir`` applies: ``kubectl kustomize`` when it is installed, else the
    resources the kustomization names (no overlays or generators are used here)."""
    if shutil.which("kubectl"):
        out = subprocess.run(["kubectl", "kustomize", str(kdir)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return [d for d in yaml.safe_load_all(out.stdout) if d]
    kust = yaml.safe_load((kdir / "kustomization.yaml").read_text())
    return docs_of(*(kdir / f for f in kust["resources"]))


def pod_templates(docs: list[dict]) -> dict[str, dict]:
    """kind/name -> the pod template's ``{metadata, spec}`` of every workload."""
    return {f"{d['kind']}/{d['metadata']['name']}": d["spec"]["template"] for d in docs
            if d["kind"] in ("DaemonSet", "Deployment", "StatefulSet")}


def podmonitor_target_labels(pm: dict, pod: dict, namespace: str) -> dict[str, str]:
    """The labels the Prometheus Operator gives a PodMonitor's target (its generated relabeling):
    namespace, pod, container, endpoint (the port's name), job (the pod label named by ``jobLabel``,
    else "NAMESPACE/PODMONITOR"), instance, plus the endpoint's own relabelings' target labels."""
    ep = pm["spec"]["podMetricsEndpoints"][0]
    job_label = pm["spec"].get("jobLabel")
    pod_labels = pod["metadata"]["labels"]
    job = pod_labels[job_label] if job_label and job_label in pod_labels else \
        f"{pm['metadata']['namespace']}/{pm['metadata']['name']}"
    container = next(c for c in pod["spec"]["containers"] if any(p.get("name") == ep["port"] for p in c["ports"]))
    labels = {"namespace": namespace, "pod": "*", "container": container["name"], "endpoint": ep["port"],
              "job": job, "instance": "*"}
    for r in ep.get("relabelings", []):
        labels[r["targetLabel"]] = "*"
    return labels


def series_labels(series: str) -> tuple[str, dict[str, str]]:
    m = re.fullmatch(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\}", series.strip())
    assert m, series
    return m.group(1), dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"', m.group(2)))


# -- alerts ---------------------------------------------------------------------------------------------

def test_prometheusrule_is_the_rule_file() -> None:
    """deploy/kubernetes/monitoring/prometheusrule.yaml is generated from the rule file, text for text
    (scripts/gen_prometheusrule.py), and says the same to a YAML reader."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts/gen_prometheusrule.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    pr = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    assert pr["apiVersion"] == "monitoring.coreos.com/v1" and pr["kind"] == "PrometheusRule"
    assert pr["spec"] == yaml.safe_load(RULES.read_text())
    assert pr["metadata"]["namespace"] == "weightd"


def test_rules_select_the_job_the_podmonitor_gives() -> None:
    """Every ``job=`` matcher in the rules, and every weightd series in the promtool tests, carries what
    the shipped PodMonitor gives the DaemonSet's and the origin's targets: the same job and exactly its
    label names. (Before: no jobLabel, so job="weightd/weightd", and WeightdDown never fired.)"""
    pm = yaml.safe_load((MONITORING / "podmonitor.yaml").read_text())
    docs = kustomization_docs(KDIR)
    pods = pod_templates(docs)
    selected = {k: p for k, p in pods.items()
                if pm["spec"]["selector"]["matchLabels"].items() <= p["metadata"]["labels"].items()}
    assert set(selected) == {"DaemonSet/weightd", "StatefulSet/weightd-origin"}
    ns = {f"{d['kind']}/{d['metadata']['name']}": d["metadata"]["namespace"] for d in docs
          if f"{d['kind']}/{d['metadata']['name']}" in selected}
    wanted = {k: podmonitor_target_labels(pm, p, ns[k]) for k, p in selected.items()}
    jobs = {w["job"] for w in wanted.values()}
    assert jobs == {"weightd"}, jobs
    rule_text = RULES.read_text()
    assert set(re.findall(r'\bjob="([^"]*)"', rule_text)) == jobs
    names = set(next(iter(wanted.values())))
    seen = 0
    for test_file in sorted((ROOT / "tests/promtool").glob("*.test.yml")):
        for t in yaml.safe_load(test_file.read_text())["tests"]:
            for s in t["input_series"]:
                metric, labels = series_labels(s["series"])
                if metric != "up" or labels.get("job") != "weightd":
                    continue
                seen += 1
                assert set(labels) == names, (test_file.name, s["series"])
                assert any(all(v == "*" or labels[k] == v for k, v in w.items()) for w in wanted.values()), s
    assert seen >= 3


@needs_promtool
def test_alert_rules_unit_tests_on_both_files(tmp_path: Path) -> None:
    """``promtool check rules`` and every tests/promtool/*.test.yml, against the rule file and against the
    rules the PrometheusRule carries (what the Prometheus Operator loads)."""
    pr = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    extracted = tmp_path / "from-prometheusrule.yml"
    extracted.write_text(yaml.safe_dump(pr["spec"], sort_keys=False))
    tests = sorted((ROOT / "tests/promtool").glob("*.test.yml"))
    assert len(tests) >= 2
    for rules in (RULES, extracted):
        proc = subprocess.run([promtool(), "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        copies = []
        for t in tests:
            doc = yaml.safe_load(t.read_text())
            doc["rule_files"] = [str(rules)]
            copies.append(tmp_path / f"{rules.stem}-{t.name}")
            copies[-1].write_text(yaml.safe_dump(doc, sort_keys=False))
        proc = subprocess.run([promtool(), "test", "rules", *map(str, copies)], capture_output=True, text=True,
                              timeout=180)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    # the alerts that answer "is weightd running on every node?" are there and tested
    names = {r.get("alert") for g in pr["spec"]["groups"] for r in g["rules"]}
    assert {"WeightdDown", "WeightdAbsent", "WeightdNodeWithoutDaemon", "WeightdDaemonSetUnwatched"} <= names
    tested = {a["alertname"] for t in tests for case in yaml.safe_load(t.read_text())["tests"]
              for a in case.get("alert_rule_test", []) if a.get("exp_alerts")}
    assert {"WeightdDown", "WeightdAbsent", "WeightdNodeWithoutDaemon", "WeightdDaemonSetUnwatched"} <= tested


@needs_kubectl
def test_monitoring_kustomization_sets_the_release_label() -> None:
    """``kubectl apply -k deploy/kubernetes/monitoring``: the PodMonitor and the PrometheusRule carry the
    ``release`` label kube-prometheus-stack selects on; the PodMonitor's pod selector is left alone."""
    docs = kustomization_docs(MONITORING)
    assert sorted(d["kind"] for d in docs) == ["PodMonitor", "PrometheusRule"]
    for d in docs:
        assert d["metadata"]["labels"].get("release"), d["kind"]
        assert d["metadata"]["namespace"] == "weightd"
    pm = next(d for d in docs if d["kind"] == "PodMonitor")
    assert pm["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "weightd"}
    assert pm["spec"]["jobLabel"] == "app.kubernetes.io/name"


# -- what `kubectl apply -k deploy/kubernetes` deploys ---------------------------------------------------

def _listen_port(addr: str) -> int:
    return int(addr.rsplit(":", 1)[1])


def test_no_two_hostnetwork_pods_share_a_host_port(tmp_path: Path) -> None:
    """The origin and a worker, both on the host's network, keep distinct ports (a worker never lands on
    an origin's node, test_no_worker_on_an_origin_node, but a mislabelled node must not half-bind): every port either
    listens on (its config's listens, its container ports) is its own. The workers' peers and trackers
    name the origin's ports. (Before: both used 9464 and 6881, and one failed to bind.)"""
    from weightd.config import load_config
    docs = kustomization_docs(KDIR)
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    used: dict[int, str] = {}
    cfgs = {}
    for name, pod in pod_templates(docs).items():
        spec = pod["spec"]
        if not spec.get("hostNetwork"):
            continue
        ports: set[int] = set()
        for c in spec.get("initContainers", []) + spec["containers"]:
            ports |= {p["containerPort"] for p in c.get("ports", [])}
            assert all(p.get("hostPort", p["containerPort"]) == p["containerPort"] for p in c.get("ports", []))
        vol = next(v for v in spec["volumes"] if v["name"] == "config")
        f = tmp_path / f"{vol['configMap']['name']}.toml"
        f.write_text(configmaps[vol["configMap"]["name"]]["data"]["weightd.toml"])
        cfg = cfgs[name] = load_config(f).settings
        listens = {_listen_port(cfg.metrics.listen), _listen_port(cfg.p2p.listen)}
        if cfg.p2p.tracker_listen:
            listens.add(_listen_port(cfg.p2p.tracker_listen))
        assert listens == ports, (name, listens, ports)   # every listen is declared, and nothing else
        for port in ports:
            assert port not in used, f"{name} and {used[port]} both listen on host port {port}"
            used[port] = name
    assert set(cfgs) == {"DaemonSet/weightd", "StatefulSet/weightd-origin"}
    worker, origin = cfgs["DaemonSet/weightd"], cfgs["StatefulSet/weightd-origin"]
    assert {_listen_port(p) for p in worker.p2p.peers} == {_listen_port(origin.p2p.listen)}
    assert {int(re.search(r":(\d+)/", t).group(1)) for t in worker.p2p.trackers} == {_listen_port(origin.p2p.tracker_listen)}


def test_two_origins_on_two_nodes_and_workers_name_both() -> None:
    """Several origins (docs/origins.md): two replicas, never on one node (they share host ports), updated
    one at a time; every worker announces to, peers with and reports to both (two hosts)."""
    from weightd.config import load_config
    from weightd.fleet.client import origin_urls
    docs = kustomization_docs(KDIR)
    sts = next(d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == "weightd-origin")
    svc = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == sts["spec"]["serviceName"])
    assert sts["spec"]["replicas"] == 2 and sts["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    pod = sts["spec"]["template"]
    anti = pod["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert [(t["topologyKey"], t["labelSelector"]["matchLabels"]) for t in anti] == \
        [("kubernetes.io/hostname", pod["metadata"]["labels"])]
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "weightd-config")
    import tempfile
    with tempfile.NamedTemporaryFile("w", suffix=".toml") as f:
        f.write(cm["data"]["weightd.toml"])
        f.flush()
        cfg = load_config(Path(f.name))
    hosts = {p.rpartition(":")[0] for p in cfg.settings.p2p.peers}
    assert len(hosts) == 2 and {re.search(r"//([^:/]+)", t).group(1) for t in cfg.settings.p2p.trackers} == hosts
    assert len(origin_urls(cfg)) == 2


def test_no_worker_on_an_origin_node() -> None:
    """Origins are known to workers by IP only: a worker on an origin's node would be taken for that
    origin (filtered out by the others, and making a dead home origin look connected). The DaemonSet's
    required node affinity keeps workers off exactly the nodes the origins' nodeSelector picks."""
    docs = kustomization_docs(KDIR)
    pods = pod_templates(docs)
    worker, origin = pods["DaemonSet/weightd"]["spec"], pods["StatefulSet/weightd-origin"]["spec"]
    (key, value), = origin["nodeSelector"].items()
    terms = worker["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms and all({"key": key, "operator": "NotIn", "values": [value]} in t["matchExpressions"] for t in terms), terms
    assert key not in worker.get("nodeSelector", {})


def test_apply_k_deploys_weightd_and_no_example_workload() -> None:
    """``kubectl apply -k deploy/kubernetes`` is weightd alone; the image is set in one place
    (``images:``, what ``kustomize edit set image`` changes); the example applies on its own."""
    docs = kustomization_docs(KDIR)
    kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in docs)
    assert kinds == ["ConfigMap/weightd-config", "ConfigMap/weightd-intent", "ConfigMap/weightd-origin-config",
                     "DaemonSet/weightd", "Namespace/weightd", "Service/weightd-metrics", "Service/weightd-origin",
                     "StatefulSet/weightd-origin"]
    kust = yaml.safe_load((KDIR / "kustomization.yaml").read_text())
    assert [i["name"] for i in kust["images"]] == ["ghcr.io/weightd/weightd"]
    images = {c["image"] for p in pod_templates(docs).values() for c in p["spec"]["containers"]}
    assert images == {f"{kust['images'][0]['newName']}:{kust['images'][0]['newTag']}"}
    ex = kustomization_docs(ROOT / "deploy/examples/vllm")
    assert {d["kind"] for d in ex} == {"Namespace", "Deployment", "ConfigMap"}


@needs_kubectl
def test_the_image_is_pointed_at_another_registry_by_the_kustomization(tmp_path: Path) -> None:
    """An overlay (or `kustomize edit set image`) changes every weightd image, sidecars included."""
    for base in (KDIR, ROOT / "deploy/examples/vllm"):
        overlay = tmp_path / base.name
        overlay.mkdir()
        (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": [os.path.relpath(base, overlay)],
            "images": [{"name": "ghcr.io/weightd/weightd", "newName": "registry.example.com/ml/weightd",
                        "newTag": "0.1.0-1"}]}))
        docs = kustomization_docs(overlay)
        pods = pod_templates(docs).values()
        weightd_images = {c["image"] for p in pods for c in p["spec"].get("initContainers", []) + p["spec"]["containers"]
                          if "weightd" in c["image"]}
        assert weightd_images == {"registry.example.com/ml/weightd:0.1.0-1"}, weightd_images
