"""Write–audit–publish on the lake: every run writes on its own branch, ``main`` only ever
receives a merge of a run that passed its audits.

A retried run (Dagster re-execution from failure) shares the branch of its root run, so outputs
committed before the failure stay visible to the retry and nothing is recomputed or lost.

Steps of one run can execute at the same time (prod runs every step in its own pod), and a
publish merges and then deletes the whole run branch. So only a run's *final* publish step,
downstream of every step that writes the run branch, may publish it (``publish_run_branch``,
``publish_with_run_branch``). A step that publishes a self-contained set of objects while other
steps of its run may still be writing (``calibration_set`` beside ``trained_model`` in
``training_cycle``) uses ``publish_objects``, which writes on a branch of its own
(``run-<root run id>-publish-<hash of its keys>``) and never touches the run branch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from .errors import NotFoundError
from .port import VersionedLake

MAIN_BRANCH = "main"
RUN_BRANCH_PREFIX = "run-"
PUBLISH_BRANCH_INFIX = "-publish-"
PUBLISH_BRANCH_HASH_CHARS = 12


def root_run_id_of(run) -> str:
    """The run id whose branch a Dagster run writes on: the root of its retry chain."""
    return run.root_run_id or run.run_id


def run_branch_name(root_run_id: str) -> str:
    """The lake branch a Dagster run (and all its retries) writes on."""
    return f"{RUN_BRANCH_PREFIX}{root_run_id}"


def publish_branch_name(root_run_id: str, keys: Iterable[str]) -> str:
    """The branch of one ``publish_objects`` call: ``run-<root>-publish-<hash of its keys>``.

    Named by the keys, not by chance, so a retry of the same publish finds the branch a killed
    attempt left; the infix keeps it apart from the run branch (root ids end in hex too).
    """
    digest = hashlib.sha256("\n".join(sorted(keys)).encode()).hexdigest()
    return (
        f"{run_branch_name(root_run_id)}{PUBLISH_BRANCH_INFIX}{digest[:PUBLISH_BRANCH_HASH_CHARS]}"
    )


def root_run_id_of_branch(name: str) -> str | None:
    """The root run id a run or publish branch belongs to; ``None`` for any other branch."""
    if not name.startswith(RUN_BRANCH_PREFIX):
        return None
    root, infix, digest = name[len(RUN_BRANCH_PREFIX) :].rpartition(PUBLISH_BRANCH_INFIX)
    if infix and len(digest) == PUBLISH_BRANCH_HASH_CHARS:
        return root
    return name[len(RUN_BRANCH_PREFIX) :]


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
    metadata = {**metadata, "root_run_id": root_run_id, "publish_branch": name}
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
    """The merge commit on ``main`` that published ``root_run_id``'s run branch, if recent.

    Merges of the run's ``publish_objects`` branches do not count: they publish only their own
    objects, never what the run wrote on its run branch. (Merges made before publish branches
    existed carry no ``publish_branch`` and were all run-branch merges.)
    """
    name = run_branch_name(root_run_id)
    for commit in lake.log(MAIN_BRANCH, limit=search_depth):
        meta = commit.metadata
        if meta.get("root_run_id") == root_run_id and meta.get("publish_branch", name) == name:
            return commit.id
    return None


def publish_objects(
    lake: VersionedLake,
    root_run_id: str,
    objects: dict[str, bytes],
    message: str,
    metadata: dict[str, str],
) -> str:
    """Write ``objects`` on a branch of their own, commit them, merge into ``main``: one act.

    For assets whose output is a set of named lake objects (datasets, manifests) rather than
    one IO-managed value; returns the merge commit id — the identity of what was published.
    Only ``objects`` reach ``main``: the run branch, and whatever steps running in parallel
    are writing there, is left alone. A branch left by a killed attempt of this same publish is
    discarded and the publish redone from the current ``main`` (it rewrites every object, and a
    stale base would conflict with keys other runs have moved since).
    """
    lake.ensure_repository()
    branch = publish_branch_name(root_run_id, objects)
    if lake.branch_exists(branch):
        lake.delete_branch(branch)
    lake.create_branch(branch, source_ref=MAIN_BRANCH)
    _commit_objects(lake, branch, objects, message, metadata)
    merge_commit = lake.merge(
        branch,
        MAIN_BRANCH,
        message=message,
        metadata={**metadata, "root_run_id": root_run_id, "publish_branch": branch},
    )
    lake.delete_branch(branch)
    return merge_commit


def publish_with_run_branch(
    lake: VersionedLake,
    root_run_id: str,
    objects: dict[str, bytes],
    message: str,
    metadata: dict[str, str],
) -> str:
    """Write ``objects`` on the run branch and merge the whole run branch into ``main``.

    For a run's final publish step only (``published_engine``: the engines and audits earlier
    steps staged go to ``main`` in the same merge as the manifest naming them). It must be
    downstream of every step of its run that writes the run branch: the merge deletes it.
    """
    _commit_objects(lake, ensure_run_branch(lake, root_run_id), objects, message, metadata)
    return publish_run_branch(lake, root_run_id, message, metadata)


def _commit_objects(
    lake: VersionedLake,
    branch: str,
    objects: dict[str, bytes],
    message: str,
    metadata: dict[str, str],
) -> None:
    """Put ``objects`` on ``branch`` and commit them (even none: the commit records the act)."""
    for key, data in objects.items():
        lake.put_object(branch, key, data)
    lake.commit(branch, message, metadata, allow_empty=True)
