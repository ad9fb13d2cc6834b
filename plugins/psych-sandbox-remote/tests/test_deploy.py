"""The Kubernetes manifests in deploy/: valid against the Kubernetes object schemas (checked by
kubernetes-validate, offline), and saying what docs/deploy.md says they say."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_validate import validate

from psych_sandbox_remote.serve import load

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
KUBERNETES = "1.30.0"

pytestmark = pytest.mark.skipif(
    not DEPLOY.is_dir(), reason="deploy/ is the repository's, not this distribution's"
)


def objects() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(DEPLOY.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            found[document["kind"]] = document
    return found


@pytest.mark.parametrize("path", sorted(DEPLOY.glob("*.yaml")), ids=lambda p: p.name)
def test_every_manifest_is_a_valid_kubernetes_object(path: Path) -> None:
    for document in yaml.safe_load_all(path.read_text()):
        # strict: a misspelt field is an error, not silently dropped by the API server.
        validate(document, KUBERNETES, strict=True)


def test_the_manifests_say_what_the_deployment_needs(tmp_path: Path) -> None:
    kinds = objects()
    assert set(kinds) >= {
        "Deployment",
        "Service",
        "NetworkPolicy",
        "RuntimeClass",
        "Secret",
        "ConfigMap",
        "HorizontalPodAutoscaler",
    }
    runtime = kinds["RuntimeClass"]
    assert runtime["handler"] == "runsc"
    pod = kinds["Deployment"]["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == runtime["metadata"]["name"]
    (container,) = pod["containers"]
    command = container["command"]
    assert command[:2] == ["psych-sandbox", "serve"]
    assert command[command.index("--profile") + 1] == "sandbox"
    # The token comes from the Secret through the environment, never the command line.
    (tokens,) = [e for e in container["env"] if e["name"] == "PSYCH_SANDBOX_SERVE_TOKENS"]
    assert tokens["valueFrom"]["secretKeyRef"]["name"] == kinds["Secret"]["metadata"]["name"]
    assert not any("token" in part.lower() for part in command)
    assert container["readinessProbe"]["httpGet"]["path"] == "/v1/description"
    for side in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][side])
    policy = kinds["NetworkPolicy"]["spec"]
    assert "Egress" in policy["policyTypes"] and policy["egress"] == []
    labels = kinds["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= labels.items()
    assert kinds["Service"]["spec"]["selector"].items() <= labels.items()
    metric = kinds["HorizontalPodAutoscaler"]["spec"]["metrics"][0]["pods"]["metric"]["name"]
    assert metric == "psych_sandbox_executions_in_flight"
    # The configuration the pods mount is one serve reads.
    config_file = tmp_path / "serve.toml"
    config_file.write_text(kinds["ConfigMap"]["data"]["serve.toml"])
    config, settings = load(str(config_file))
    assert config.profiles["sandbox"].backend == "bwrap"
    assert settings.capacity == 2
    assert settings.tenants["team-b"].limits["cpu_seconds"] == 10
