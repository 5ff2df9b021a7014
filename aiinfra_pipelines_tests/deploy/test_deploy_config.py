"""The Helm values and the production ``dagster.yaml`` describe the same deployment.

The chart renders its own instance ConfigMap from ``helm-values.yaml``; ``dagster.yaml`` is the
same instance for non-Helm installs (and what ``test_prod_instance`` runs on Postgres). If one
changes without the other, the cluster silently runs different queue limits, retries or
secrets than the file the team reviews — these tests name the difference.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from aiinfra_pipelines.config import PROJECT_ROOT, load_resource_yaml


@pytest.fixture(scope="module")
def helm() -> dict[str, Any]:
    return load_resource_yaml("deploy/helm-values.yaml")


@pytest.fixture(scope="module")
def instance() -> dict[str, Any]:
    return load_resource_yaml("deploy/dagster.yaml")


def _names(entries: list[Any]) -> set[str]:
    return {entry["name"] if isinstance(entry, dict) else entry for entry in entries}


def test_the_user_deployment_serves_this_code_location_in_prod(helm) -> None:
    workspace = yaml.safe_load((PROJECT_ROOT / "workspace.yaml").read_text())
    module = workspace["load_from"][0]["python_module"]
    module = module if isinstance(module, str) else module["module_name"]
    (deployment,) = helm["dagster-user-deployments"]["deployments"]
    args = deployment["dagsterApiGrpcArgs"]
    assert args[args.index("--module-name") + 1] == module
    assert deployment["env"]["AIINFRA_ENV"] == "prod"
    assert deployment["env"]["AIINFRA_RESOURCES"], "an installed package must find resources/"
    assert deployment["includeConfigInLaunchedRuns"]["enabled"] is True


def test_runs_get_the_same_secrets_everywhere(helm, instance) -> None:
    (deployment,) = helm["dagster-user-deployments"]["deployments"]
    from_deployment = _names(deployment["envSecrets"])
    from_chart_launcher = _names(helm["runLauncher"]["config"]["k8sRunLauncher"]["envSecrets"])
    from_instance = _names(instance["run_launcher"]["config"]["env_secrets"])
    assert from_deployment == from_chart_launcher == from_instance
    assert {"aiinfra-lakefs", "aiinfra-mlflow", "aiinfra-anonymization"} <= from_instance
    assert helm["runLauncher"]["type"] == instance["run_launcher"]["class"] == "K8sRunLauncher"


def test_queue_pools_and_retries_match(helm, instance) -> None:
    chart, runs = helm["concurrency"], instance["concurrency"]["runs"]
    assert chart["enabled"] is True
    assert chart["runs"]["maxConcurrentRuns"] == runs["max_concurrent_runs"]
    assert chart["runs"]["tagConcurrencyLimits"] == runs["tag_concurrency_limits"]
    assert chart["pools"]["defaultLimit"] == instance["concurrency"]["pools"]["default_limit"]
    assert chart["pools"]["granularity"] == instance["concurrency"]["pools"]["granularity"]
    daemon = helm["dagsterDaemon"]
    assert daemon["runRetries"]["enabled"] == instance["run_retries"]["enabled"]
    assert daemon["runRetries"]["maxRetries"] == instance["run_retries"]["max_retries"]
    assert (
        daemon["runRetries"]["retryOnAssetOrOpFailure"]
        == instance["run_retries"]["retry_on_asset_or_op_failure"]
    )
    monitoring = instance["run_monitoring"]
    assert daemon["runMonitoring"]["startTimeoutSeconds"] == monitoring["start_timeout_seconds"]
    assert daemon["runMonitoring"]["maxResumeRunAttempts"] == monitoring["max_resume_run_attempts"]
    assert (
        helm["postgresql"]["postgresqlScheme"]
        == (instance["storage"]["postgres"]["postgres_db"]["scheme"])
    )


def test_the_local_instance_has_the_same_queue_shape(instance) -> None:
    """dagster_home/dagster.yaml is the laptop-sized copy: same tags and pools, smaller."""
    local = yaml.safe_load((PROJECT_ROOT / "dagster_home" / "dagster.yaml").read_text())

    def shape(config: dict[str, Any]) -> set[tuple[str, str]]:
        limits = config["concurrency"]["runs"]["tag_concurrency_limits"]
        return {(limit["key"], limit["value"]) for limit in limits}

    assert shape(local) == shape(instance)
    assert (
        local["concurrency"]["pools"]["granularity"]
        == (instance["concurrency"]["pools"]["granularity"])
    )


_SENSITIVE = re.compile(r"password|secret|token|private|credential|_key$", re.IGNORECASE)
# Keys whose value *names* a Kubernetes Secret (e.g. postgres_password_secret) hold no secret.
_SECRET_NAME = re.compile(r"(_secret|Secret|secretName)$")


def _literal_secrets(node: Any, path: str = "") -> list[str]:
    found: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            where = f"{path}.{key}"
            named = _SECRET_NAME.search(str(key))
            if isinstance(value, str) and value and _SENSITIVE.search(str(key)) and not named:
                found.append(where)
            found.extend(_literal_secrets(value, where))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            if isinstance(value, str) and "=" in value:
                name, _, literal = value.partition("=")
                if literal and _SENSITIVE.search(name):
                    found.append(f"{path}[{index}]")
            found.extend(_literal_secrets(value, f"{path}[{index}]"))
    return found


@pytest.mark.parametrize(
    "name",
    ["deploy/helm-values.yaml", "deploy/dagster.yaml", "deploy/k8s_executor.yaml",
     "environments/prod.yaml"],
)  # fmt: skip
def test_no_secret_value_is_written_in_deploy_configuration(name: str) -> None:
    config = load_resource_yaml(name)
    assert _literal_secrets(config) == []
    # Every credential of the instance is read from the environment.
    if name == "deploy/dagster.yaml":
        assert config["storage"]["postgres"]["postgres_db"]["password"] == {
            "env": "DAGSTER_PG_PASSWORD"
        }


def test_the_secret_scanner_finds_literals() -> None:
    assert _literal_secrets({"a": {"postgresqlPassword": "hunter2"}}) == [".a.postgresqlPassword"]
    assert _literal_secrets({"postgres_password_secret": "dagster-postgresql-secret"}) == []
    assert _literal_secrets({"envVars": ["AWS_SECRET_ACCESS_KEY=abc", "AIINFRA_ENV=prod"]}) == [
        ".envVars[0]"
    ]
