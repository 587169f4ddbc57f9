"""k8s:// targets against a real kube-apiserver, with real gRPC servers on pod addresses (10.77.0.x, fd77::2)
inside a private network namespace made by this test run: harness/k8s/scenarios.py has the scenarios, each
bounded; harness/k8s/support.py builds the apiserver (cached) and runs the namespace. Skips, saying why, without
Go, unshare or ip."""

from __future__ import annotations

import pytest

from harness.k8s import support as k8s_support

pytestmark = [k8s_support.timeout_mark()]


@pytest.mark.parametrize("scenario", [
    "slices_merged_readiness_terminating",
    "named_and_numbered_ports_and_context_namespace",
    "service_appears_after_dial",
    "relist_after_410_without_spurious_removal",
    "apiserver_restart_keeps_serving",
    "kubeconfig_auth_and_clear_refusals",
    "in_cluster_config_and_token_rotation",
    "cli_resolve_and_watch",
    "examples_in_pods",
])
def test_k8s_resolver(netns_host, scenario):
    netns_host.run(scenario, timeout=90)


def test_bench_scenario_measures_every_change(netns_host, tmp_path):
    """bench/k8s.py's scenario, short: every change is measured on both sides (no timing asserted)."""
    import json

    out = tmp_path / "samples.json"
    netns_host.run("bench_slice_to_picker", timeout=90, args={"changes": 5, "out": str(out)})
    data = json.loads(out.read_text())
    assert len(data["raw_watch_ms"]) == len(data["picker_ms"]) == 5
    assert all(x > 0 for x in data["raw_watch_ms"] + data["picker_ms"])
