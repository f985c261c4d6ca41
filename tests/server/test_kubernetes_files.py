"""The Kubernetes deployment (deploy/kubernetes/): no cluster here, so validate it against the
Kubernetes API schemas (offline, kubernetes-validate) and check what the balancer relies on."""

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KUBERNETES_VERSION = "1.32"


def resources() -> list[dict]:
    return [doc for file in sorted((DEPLOY / "kubernetes").glob("*.yaml")) for doc in yaml.safe_load_all(file.read_text())]


def resource(kind: str, name: str) -> dict:
    (found,) = [doc for doc in resources() if doc["kind"] == kind and doc["metadata"]["name"] == name]
    return found


@pytest.mark.parametrize("doc", resources(), ids=lambda doc: f"{doc['kind']}-{doc['metadata']['name']}")
def test_each_resource_is_valid_kubernetes(doc):
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)  # raises on an unknown or mistyped field


def test_the_validator_rejects_a_mistake():
    broken = resource("StatefulSet", "triton")
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["portt"] = 8000
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_one_gpu_per_triton_with_probes_on_its_health_endpoints_and_scraped_metrics():
    pod = resource("StatefulSet", "triton")["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(ports["metrics"])


def test_the_balancer_runs_the_shipped_config_against_the_statefulset_s_pods():
    shipped = (DEPLOY / "haproxy" / "haproxy.cfg").read_text()
    assert resource("ConfigMap", "haproxy")["data"]["haproxy.cfg"] == shipped
    assert "balance hdr(triton-sam-image)" in shipped and "hash-type consistent" in shipped
    service, triton = resource("Service", "triton"), resource("StatefulSet", "triton")
    assert service["spec"]["clusterIP"] == "None" and triton["spec"]["serviceName"] == "triton"
    servers = [line.split() for line in shipped.splitlines() if line.lstrip().startswith("server ")]
    namespace = triton["metadata"]["namespace"]
    expected = [f"triton-{i}.triton.{namespace}.svc.cluster.local:8001" for i in range(triton["spec"]["replicas"])]
    assert [server[2] for server in servers] == expected
    assert all(server[3:] == ["port", "8000"] for server in servers)  # readiness checked on Triton's HTTP port
    front = resource("Service", "triton-sam")["spec"]
    assert front["selector"] == resource("Deployment", "haproxy")["spec"]["template"]["metadata"]["labels"]
    assert front["ports"][0]["port"] == 8001 and "bind :8001 proto h2" in shipped
