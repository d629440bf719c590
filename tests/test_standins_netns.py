"""Root only: a network-namespace "pod" resolves Service names the way glibc does in a real pod (search path,
ndots:5) through the DNS stand-in, and joins a run with in-cluster config over HTTPS from its own IP.

All addresses are a /30 inside 198.18.0.0/15 made here; the namespace, veth and /etc/netns entry are removed
afterwards (the fixture fails if anything is left).
"""

import json
import os
import sys

import pytest
from kubernetes import client

from tests.standins import netns
from tests.standins.cluster import StandInCluster, resolv_conf
from tests.standins.dns import DnsServer
from tests.standins.kube import Call, KubeStandIn
from tests.support.paths import ROOT
from trainer.k8s import objects

REASON = netns.unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"network-namespace pods: {REASON}")

RUN_ID = "0b6f5a3e-8c1d-4c53-9b8e-2f1e4d5c6a7b"
RESOLVE = """import json, socket, sys
out = {}
for name in sys.argv[1:]:
    try:
        out[name] = sorted({info[4][0] for info in socket.getaddrinfo(name, None)})
    except socket.gaierror as err:
        out[name] = f"gaierror {err.errno}"
print(json.dumps(out))
"""
JOIN = """import json, sys
from trainer.cluster import discovery
addresses = json.loads(sys.argv[1])
discovery.join_cluster({"worker": addresses}, "worker", 0, sys.argv[2], timeout=20, unschedulable_timeout=20)
"""


@pytest.fixture(scope="module")
def pod():
    subnet = netns.free_subnet()
    with netns.NetnsPod(f"kfpt{os.getpid()}", subnet, resolv_conf(str(subnet[1]))) as made:
        yield made


def _pod_env(**extra: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(ROOT),
        "PYTHONDONTWRITEBYTECODE": "1",
        **extra,
    }


def test_glibc_in_a_pod_resolves_a_service_name_through_the_search_path(pod):
    standin = KubeStandIn()
    standin.add(
        "services",
        "default",
        {"metadata": {"name": "tfw-x-0"}, "spec": {"clusterIP": "None", "selector": {"app": "x"}}},
    )
    standin.add_pod("default", "x-pod", labels={"app": "x"}, ip=pod.pod_ip)
    names = ["tfw-x-0.default.svc", "tfw-x-0", "tfw-x-0.default.svc.cluster.local", "tfw-x-1.default.svc"]
    with DnsServer(standin.dns_records, pod.host_ip, 53):
        result = pod.run([sys.executable, "-c", RESOLVE, *names], env=_pod_env(), timeout=30)
    assert result.returncode == 0, result.stderr
    answers = json.loads(result.stdout)
    assert answers.pop("tfw-x-1.default.svc").startswith("gaierror"), "an unknown name fails after the search list"
    assert answers == dict.fromkeys(names[:3], [pod.pod_ip])


def test_a_pod_labels_itself_over_https_and_resolves_its_peers(pod, tmp_path):
    with StandInCluster.start(tmp_path, pod.host_ip, namespace="default", dns_port=53) as cluster:
        standin = cluster.api
        core = client.CoreV1Api(client.ApiClient(cluster.files.configuration(cluster.https.port)))
        addresses = objects.task_addresses(RUN_ID, 2, "default")
        objects.ensure_service(core, "default", RUN_ID, 1, 2222, None)
        standin.add_pod("default", "train-worker-1", labels=objects.pod_labels(RUN_ID, 1), ip=pod.host_ip)
        env = _pod_env(**cluster.pod_env("train-worker-0"), POD_IP=pod.pod_ip)
        joined = pod.run(
            [sys.executable, "-c", JOIN, json.dumps(addresses), RUN_ID],
            env=env,
            serviceaccount=cluster.files.serviceaccount,
            timeout=60,
        )
        hosts = [a.split(":")[0] for a in addresses]
        resolved = pod.run([sys.executable, "-c", RESOLVE, *hosts], env=env, timeout=30)
    assert joined.returncode == 0, joined.stderr
    assert standin.get("pods", "default", "train-worker-0")["status"]["podIP"] == pod.pod_ip, "learned from the caller"
    assert Call("patch", "pods", "default", "train-worker-0") in standin.calls
    assert resolved.returncode == 0, resolved.stderr
    assert json.loads(resolved.stdout) == {hosts[0]: [pod.pod_ip], hosts[1]: [pod.host_ip]}
    assert not os.path.exists("/run/secrets/kubernetes.io"), "the pod's mounts stay out of the host's sight"
