"""The MLflow Model Registry as the release layer uses it: version tags and the two aliases.

A candidate's identity is its registered-model version (``docs/loop.md``). Its tags tie it to
the dataset commit, code, Dagster run, ONNX/engine hashes, certificate and reports; the aliases
``candidate`` and ``production`` say what is being released and what the fleet runs. Every
move of an alias goes through ``ModelRegistry`` so the registry and the lake never disagree
about what they are called.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiinfra_pipelines.config import settings_section

CANDIDATE_ALIAS = "candidate"
PRODUCTION_ALIAS = "production"
RELEASE_ALIASES = (CANDIDATE_ALIAS, PRODUCTION_ALIAS)
DEFAULT_REGISTERED_MODEL = "perception"


class RegistryError(RuntimeError):
    """A registry operation failed; the message names the model, version or alias."""


def registered_model_name() -> str:
    """``resources/training.yaml`` → ``mlflow.registered_model`` (default ``perception``)."""
    mlflow_settings = settings_section("training.yaml").section("mlflow", {})
    return str(mlflow_settings.raw("registered_model", None) or DEFAULT_REGISTERED_MODEL)


@dataclass(frozen=True)
class ModelVersionInfo:
    """What the registry knows about one version."""

    name: str
    version: str
    tags: dict[str, str]
    aliases: list[str]
    source: str
    run_id: str | None


class ModelRegistry:
    """Tags and aliases of one registered model on one MLflow tracking/registry store.

    Built from a tracking URI (``MlflowTracking.uri()``), not held as a Dagster resource: the
    MLflow client is cheap to create and must not be pickled into step processes.
    """

    def __init__(self, tracking_uri: str, registered_model: str | None = None) -> None:
        from mlflow import MlflowClient  # MLflow costs seconds to import; only callers pay

        self.tracking_uri = tracking_uri
        self.name = registered_model or registered_model_name()
        self._client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)

    # ------------------------------------------------------------------------------ versions
    def version(self, version: str) -> ModelVersionInfo:
        """The version's tags and aliases; ``RegistryError`` when it is not registered."""
        from mlflow.exceptions import MlflowException

        try:
            found = self._client.get_model_version(self.name, str(version))
        except MlflowException as error:
            raise RegistryError(
                f"model version {self.name!r} v{version} is not in the registry at "
                f"{self.tracking_uri}: {error.message}"
            ) from error
        return ModelVersionInfo(
            name=self.name,
            version=str(found.version),
            tags=dict(found.tags or {}),
            aliases=list(found.aliases or []),
            source=str(found.source or ""),
            run_id=found.run_id,
        )

    def version_tags(self, version: str) -> dict[str, str]:
        return self.version(version).tags

    def set_tags(self, version: str, tags: Mapping[str, Any]) -> None:
        """Set several version tags (values stringified); the version must exist."""
        self.version(version)  # a clear error for an unknown version, before any write
        for key, value in tags.items():
            self._client.set_model_version_tag(self.name, str(version), key, str(value))

    def tag(self, version: str, key: str, value: Any) -> None:
        self.set_tags(version, {key: value})

    def delete_tag(self, version: str, key: str) -> None:
        if key in self.version_tags(version):
            self._client.delete_model_version_tag(self.name, str(version), key)

    # ------------------------------------------------------------------------------- aliases
    def set_alias(self, alias: str, version: str) -> None:
        """Point ``alias`` at ``version`` (moving it from wherever it pointed)."""
        _check_alias(alias)
        self.version(version)
        self._client.set_registered_model_alias(self.name, alias, str(version))

    def get_alias(self, alias: str) -> str | None:
        """The version ``alias`` points at, or ``None`` when it is not set."""
        from mlflow.exceptions import MlflowException

        _check_alias(alias)
        try:
            return str(self._client.get_model_version_by_alias(self.name, alias).version)
        except MlflowException as error:
            if error.error_code in ("INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST"):
                return None
            raise

    def delete_alias(self, alias: str) -> None:
        """Remove ``alias``; removing an unset alias is not an error."""
        _check_alias(alias)
        if self.get_alias(alias) is not None:
            self._client.delete_registered_model_alias(self.name, alias)


def _check_alias(alias: str) -> None:
    if alias not in RELEASE_ALIASES:
        raise RegistryError(
            f"alias {alias!r} is not a release alias (expected one of {', '.join(RELEASE_ALIASES)})"
        )


# ----------------------------------------------------------------------- certification tags
CERTIFICATION_TAG = "certification"
FAILED_GATES_TAG = "certification_failed_gates"
REFUSAL_TAG = "certification_refusal"
_MAX_TAG_TEXT = 5000  # MLflow caps tag values (8000 chars in its stores)


def record_certification(
    registry: ModelRegistry, certificate: Mapping[str, Any], *, move_candidate_alias: bool = True
) -> dict[str, str]:
    """Tag the version as certified (certificate and every hash it binds) and, by default,
    point the ``candidate`` alias at it: the certified candidate is what shadow/rollout take.
    Returns the tags set."""
    version = str(certificate["model_version"])
    tags = {
        CERTIFICATION_TAG: "passed",
        "certificate_sha256": str(certificate["certificate_sha256"]),
        "certificate_key": str(certificate["certificate_key"]),
        "certificate_key_id": str(certificate["key_id"]),
        "onnx_sha256": str(certificate["onnx"]["sha256"]),
        "engine_sha256": str(certificate["engine"]["sha256"]),
        **{
            f"report_{gate}_sha256": str(entry["sha256"])
            for gate, entry in certificate["reports"].items()
        },
    }
    registry.set_tags(version, tags)
    for stale in (FAILED_GATES_TAG, REFUSAL_TAG):
        registry.delete_tag(version, stale)
    if move_candidate_alias:
        registry.set_alias(CANDIDATE_ALIAS, version)
    return tags


def record_refusal(
    registry: ModelRegistry, model_version: str, failed_gates: list[str], message: str
) -> dict[str, str]:
    """Tag the version as refused, naming the failed gates; a refused version never keeps the
    ``candidate`` alias. Returns the tags set."""
    tags = {
        CERTIFICATION_TAG: "refused",
        FAILED_GATES_TAG: ",".join(failed_gates),
        REFUSAL_TAG: message[:_MAX_TAG_TEXT],
    }
    registry.set_tags(str(model_version), tags)
    if registry.get_alias(CANDIDATE_ALIAS) == str(model_version):
        registry.delete_alias(CANDIDATE_ALIAS)
    return tags
