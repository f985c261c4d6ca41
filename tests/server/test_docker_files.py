"""The Docker deployment files: no Docker engine here, so check what a reviewer would."""

from pathlib import Path

import yaml

DOCKER = Path(__file__).resolve().parents[2] / "docker"


def test_compose_exposes_ports_gpu_shm_volume_and_healthcheck():
    service = yaml.safe_load((DOCKER / "docker-compose.yml").read_text())["services"]["triton"]
    assert {p.split(":")[0] for p in service["ports"]} == {"8000", "8001", "8002"}
    assert service["volumes"] == ["${TRITON_SAM_MODEL_REPOSITORY:-../model_repository}:/models:ro"]  # as the CLI's
    assert (DOCKER / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
    assert service["shm_size"]
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert "/v2/health/ready" in " ".join(service["healthcheck"]["test"])


def test_dockerfile_pins_the_triton_image_and_tolerates_a_partial_repository():
    text = (DOCKER / "Dockerfile").read_text()
    assert "ARG TRITON_VERSION=25.01" in text and "nvcr.io/nvidia/tritonserver:${TRITON_VERSION}-py3" in text
    assert "--exit-on-error=false" in text and "--model-repository=/models" in text
    assert 'pip install --no-cache-dir "onnxruntime-gpu==${ONNXRUNTIME_VERSION}"' in text  # for the session models
    compose = yaml.safe_load((DOCKER / "docker-compose.yml").read_text())
    assert compose["services"]["triton"]["build"]["args"]["TRITON_VERSION"] == "25.01"
