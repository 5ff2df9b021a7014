"""Write–audit–publish on the lake: every run writes on its own branch, ``main`` only ever
receives a merge of a run that passed its audits.

A retried run (Dagster re-execution from failure) shares the branch of its root run, so outputs
committed before the failure stay visible to the retry and nothing is recomputed or lost.
"""

from __future__ import annotations

from .errors import NotFoundError
from .port import VersionedLake

MAIN_BRANCH = "main"
RUN_BRANCH_PREFIX = "run-"


def root_run_id_of(run) -> str:
    """The run id whose branch a Dagster run writes on: the root of its retry chain."""
    return run.root_run_id or run.run_id


def run_branch_name(root_run_id: str) -> str:
    """The lake branch a Dagster run (and all its retries) writes on."""
    return f"{RUN_BRANCH_PREFIX}{root_run_id}"


def ensure_run_branch(lake: VersionedLake, root_run_id: str) -> str:
    """Create the run branch from ``main`` on first use; idempotent across steps and retries."""
    lake.ensure_repository()
    name = run_branch_name(root_run_id)
    lake.create_branch(name, source_ref=MAIN_BRANCH, exist_ok=True)
    return name


def read_ref(lake: VersionedLake, root_run_id: str | None) -> str:
    """Where a step reads: its run branch when the run has written, otherwise ``main``."""
    if root_run_id:
        name = run_branch_name(root_run_id)
        if lake.branch_exists(name):
            return name
    return MAIN_BRANCH


def publish_run_branch(
    lake: VersionedLake,
    root_run_id: str,
    message: str,
    metadata: dict[str, str],
    delete_after: bool = True,
) -> str:
    """Merge the run branch into ``main`` and return the merge commit id.

    Staged leftovers are committed first so nothing the run wrote is lost. The branch is deleted
    after a successful merge (its commits stay reachable from ``main``); on any error the branch
    is kept for inspection and ``main`` is untouched.
    """
    name = run_branch_name(root_run_id)
    metadata = {**metadata, "root_run_id": root_run_id}
    if not lake.branch_exists(name):
        # A retry after the merge succeeded but before the step reported it: already published.
        earlier = find_publish(lake, root_run_id)
        if earlier is not None:
            return earlier
        raise NotFoundError(f"run branch {name!r} does not exist: nothing was written to publish")
    if lake.uncommitted(name):
        lake.commit(name, f"{message} (staged leftovers)", metadata)
    merge_commit = lake.merge(name, MAIN_BRANCH, message=message, metadata=metadata)
    if delete_after:
        lake.delete_branch(name)
    return merge_commit


def find_publish(lake: VersionedLake, root_run_id: str, search_depth: int = 500) -> str | None:
    """The merge commit on ``main`` that published ``root_run_id``'s branch, if recent."""
    for commit in lake.log(MAIN_BRANCH, limit=search_depth):
        if commit.metadata.get("root_run_id") == root_run_id:
            return commit.id
    return None


def publish_objects(
    lake: VersionedLake,
    root_run_id: str,
    objects: dict[str, bytes],
    message: str,
    metadata: dict[str, str],
) -> str:
    """Write ``objects`` on the run branch, commit them, merge into ``main``: one published act.

    For assets whose output is a set of named lake objects (datasets, manifests) rather than
    one IO-managed value; returns the merge commit id — the identity of what was published.
    """
    branch = ensure_run_branch(lake, root_run_id)
    for key, data in objects.items():
        lake.put_object(branch, key, data)
    lake.commit(branch, message, metadata, allow_empty=True)
    return publish_run_branch(lake, root_run_id, message, metadata)
