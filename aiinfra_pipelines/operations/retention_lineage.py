"""What depends on raw upload commits, read from ``main``: the lineage retention must respect.

Four kinds of dependent name the raw-log commits (and logs) they were built from:

* ``dataset``: every training dataset version (tag ``dataset-v*``) — its manifest's
  ``source_commits`` (the ingest-branch commits that landed its logs) and its ``logs``;
* ``benchmark``: the frozen benchmark set — its member logs and the ``source_commit`` of their
  frames;
* ``scenario``: regression scenarios derived from fleet logs (``source.source_commit`` and
  ``source.log_id`` in the scenario library);
* ``certificate``: every certified engine, through the dataset its model trained on (what
  ``aiinfra trace`` follows: model → dataset commit → ``source_commits``).

Whatever cannot be read (a tag whose manifest is gone, a certificate naming a dataset that is
not in the lake) is a *problem*, never a silent gap: a plan made with problems keeps everything,
because an unreadable lineage cannot prove that raw data is unused.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from aiinfra_pipelines.datasets.benchmark import benchmark_log_ids
from aiinfra_pipelines.datasets.manifest import DATASET_TAG_PREFIX, dataset_logs
from aiinfra_pipelines.datasets.selection import BENCHMARK_MANIFEST
from aiinfra_pipelines.lake.layout import (
    CANDIDATES_PREFIX,
    MAIN_BRANCH,
    training_manifest_key,
)
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.release.trace import lineage as trace_lineage
from aiinfra_pipelines.simulation.library import LIBRARY_KEY

from .retention_settings import BENCHMARK, CERTIFICATE, DATASET, SCENARIO

CERTIFICATE_FILE = "certificate.json"


@dataclass(frozen=True)
class Dependent:
    """One thing built from raw uploads: the commits and log ids it names."""

    kind: str
    name: str
    source_commits: frozenset[str]
    logs: frozenset[str]

    @property
    def label(self) -> str:
        return f"{self.kind} {self.name}"

    @property
    def certified(self) -> bool:
        return self.kind == CERTIFICATE


@dataclass
class RawLineage:
    """Every dependent on ``main`` and what could not be read."""

    dependents: list[Dependent] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def on_commits(self, commits: Iterable[str]) -> list[Dependent]:
        """Dependents built from any of ``commits`` (a branch: every upload commit on it)."""
        wanted = set(commits)
        return [d for d in self.dependents if d.source_commits & wanted]

    def on_log(self, commit: str, log_id: str) -> list[Dependent]:
        """Dependents built from the log ``log_id`` as landed by ``commit``."""
        return [d for d in self.dependents if commit in d.source_commits and log_id in d.logs]


def _manifest_logs(manifest: dict[str, Any]) -> frozenset[str]:
    return frozenset(dataset_logs(manifest))


def _training_manifest(
    lake: VersionedLake, version: str, commit: str, found: RawLineage
) -> dict[str, Any] | None:
    key = training_manifest_key(version)
    try:
        manifest = lake.get_json_or_none(commit, key)
    except LookupError:
        manifest = None
    if manifest is None:
        found.problems.append(f"{version}: {key} is not at commit {commit[:12]}")
    return manifest


def _datasets(lake: VersionedLake, found: RawLineage) -> dict[str, Dependent]:
    """Every tagged training dataset version, by the commit its tag points at."""
    by_commit: dict[str, Dependent] = {}
    for tag, commit in sorted(lake.list_tags().items()):
        if not tag.startswith(DATASET_TAG_PREFIX):
            continue
        manifest = _training_manifest(lake, tag, commit, found)
        if manifest is not None:
            commits = frozenset(str(c) for c in manifest.get("source_commits") or [])
            by_commit[commit] = Dependent(DATASET, tag, commits, _manifest_logs(manifest))
    found.dependents += by_commit.values()
    return by_commit


def _benchmark(lake: VersionedLake, found: RawLineage) -> None:
    manifest = lake.get_json_or_none(MAIN_BRANCH, BENCHMARK_MANIFEST)
    if manifest is None:
        return
    version = str(manifest.get("version"))
    frames_key = manifest.get("frames_key")
    if not frames_key or not lake.object_exists(MAIN_BRANCH, frames_key):
        found.problems.append(f"benchmark {version}: its frames ({frames_key}) are not on main")
        return
    frames = lake.get_parquet(MAIN_BRANCH, frames_key)
    if "source_commit" not in frames.columns:
        found.problems.append(f"benchmark {version}: {frames_key} has no source_commit column")
        return
    commits = frozenset(frames["source_commit"].astype(str))
    logs = frozenset(benchmark_log_ids(manifest))
    found.dependents.append(Dependent(BENCHMARK, version, commits, logs))


def _scenarios(lake: VersionedLake, found: RawLineage) -> None:
    library = lake.get_json_or_none(MAIN_BRANCH, LIBRARY_KEY) or {}
    for entry in library.get("scenarios", []):
        source = entry.get("source") or {}
        commit = str(source.get("source_commit") or "")
        if commit:  # derived from a fleet log (YAML-defined scenarios name no commit)
            logs = frozenset({str(source["log_id"])}) if source.get("log_id") else frozenset()
            scenario = Dependent(SCENARIO, str(entry["id"]), frozenset({commit}), logs)
            found.dependents.append(scenario)


def certified_versions(lake: VersionedLake) -> list[str]:
    """Model versions with a certificate on ``main``."""
    return sorted(
        {
            stat.key[len(CANDIDATES_PREFIX) :].split("/", 1)[0]
            for stat in lake.list_objects(MAIN_BRANCH, prefix=CANDIDATES_PREFIX)
            if stat.key.endswith(f"/{CERTIFICATE_FILE}")
        }
    )


def _certificates(lake: VersionedLake, found: RawLineage, datasets: dict[str, Dependent]) -> None:
    """Every certified engine, with the raw lineage of the dataset its model trained on."""
    for version in certified_versions(lake):
        traced = trace_lineage(lake, version)
        name = f"model {version}"
        if traced.source_commits is None or not traced.dataset_commit:
            found.problems.append(f"certified {name}: {traced.dataset_note}")
            continue
        dataset = datasets.get(traced.dataset_commit)
        if dataset is not None:
            logs = dataset.logs
        else:  # its dataset's tag is gone: read the manifest at the commit the model recorded
            manifest = _training_manifest(
                lake, str(traced.dataset_version), traced.dataset_commit, found
            )
            logs = _manifest_logs(manifest or {})
        label = f"{name} ({traced.dataset_version})"
        found.dependents.append(
            Dependent(CERTIFICATE, label, frozenset(traced.source_commits), logs)
        )


def read_raw_lineage(lake: VersionedLake) -> RawLineage:
    """Every dependent of raw uploads on ``main`` (see the module docstring)."""
    found = RawLineage()
    datasets = _datasets(lake, found)
    _benchmark(lake, found)
    _scenarios(lake, found)
    _certificates(lake, found, datasets)
    return found
