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

Every write outside the IO manager's single objects goes through ``commit_changes``: the writes
and deletes of one act, staged and committed once (the local counterpart of the lakeFS SDK's
``branch.transact``), so no caller leaves a half-staged branch or commits twice for one act.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping

from .errors import NotFoundError
from .layout import MAIN_BRANCH
from .port import VersionedLake

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
    commit_changes(lake, branch, message, metadata, puts=objects)
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
    *,
    deletes: Iterable[str] = (),
) -> str:
    """Write ``objects`` (and remove ``deletes``) on the run branch, then merge the whole run
    branch into ``main``.

    For a run's final publish step only (``published_engine``: the engines and audits earlier
    steps staged go to ``main`` in the same merge as the manifest naming them; a rollout's
    state change together with the pointer it removes). It must be downstream of every step of
    its run that writes the run branch: the merge deletes it.
    """
    branch = ensure_run_branch(lake, root_run_id)
    commit_changes(lake, branch, message, metadata, puts=objects, deletes=deletes)
    return publish_run_branch(lake, root_run_id, message, metadata)


def commit_changes(
    lake: VersionedLake,
    branch: str,
    message: str,
    metadata: dict[str, str],
    *,
    puts: Mapping[str, bytes] | Iterable[tuple[str, bytes]] = (),
    deletes: Iterable[str] = (),
    allow_empty: bool = True,
    on_put: Callable[[int], None] | None = None,
) -> str:
    """Stage ``puts`` then ``deletes`` on ``branch`` and commit them as one commit; its id.

    A delete of a key that is not there is skipped, so a retried act converges instead of
    failing on what its first attempt already removed. ``allow_empty`` (the default) commits
    even when nothing changed — the commit records the act, and a branch shared with other
    writers may have had its staging taken by their commit; pass ``False`` where re-sending
    identical content is a mistake the caller wants raised (``NothingToCommitError``).
    ``on_put`` hears the number of objects staged so far, for progress on large uploads.
    """
    items = puts.items() if isinstance(puts, Mapping) else puts
    for done, (key, data) in enumerate(items, start=1):
        lake.put_object(branch, key, data)
        if on_put is not None:
            on_put(done)
    for key in deletes:
        if lake.object_exists(branch, key):
            lake.delete_object(branch, key)
    return lake.commit(branch, message, metadata, allow_empty=allow_empty)
