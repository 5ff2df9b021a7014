"""Errors raised by every ``VersionedLake`` adapter.

Callers (assets, sensors, the IO manager) handle lake failures by type, never by parsing SDK
messages, so each adapter translates its backend's exceptions into exactly these classes. That
is what lets a pipeline written against ``LocalLake`` behave the same on a lakeFS server.
"""

from __future__ import annotations

from collections.abc import Iterable


class LakeError(Exception):
    """Base class: any failure of a lake operation (also raised for refused operations)."""


class InvalidKeyError(LakeError, ValueError):
    """An object key, prefix, branch or tag name is malformed and was rejected before any I/O."""


class NotFoundError(LakeError, LookupError):
    """A repository, branch, tag, commit/ref or object does not exist."""


class BranchExistsError(LakeError):
    """``create_branch`` was asked for a branch that already exists (and ``exist_ok`` is off)."""


class TagExistsError(LakeError):
    """``create_tag`` was asked for a tag that already exists: tags are immutable dataset ids."""


class MergeConflictError(LakeError):
    """A three-way merge found keys changed differently on both sides since the merge base.

    ``conflicts`` lists those keys (sorted) so the caller can report or resolve them; the
    destination branch is left untouched when this is raised.
    """

    def __init__(self, conflicts: Iterable[str], source: str = "", destination: str = "") -> None:
        self.conflicts: list[str] = sorted(set(conflicts))
        self.source = source
        self.destination = destination
        shown = ", ".join(self.conflicts[:20])
        if len(self.conflicts) > 20:
            shown += f", ... ({len(self.conflicts) - 20} more)"
        where = f" of {source!r} into {destination!r}" if source or destination else ""
        super().__init__(
            f"merge{where} conflicts on {len(self.conflicts)} key(s): {shown or '(unknown)'}"
        )

    def __reduce__(self):  # type: ignore[override]
        # Exceptions pickle as ``cls(*self.args)``; our args is the message, not the key list,
        # so rebuild from the real constructor arguments (Dagster ships errors across processes).
        return (type(self), (self.conflicts, self.source, self.destination))


class NothingToCommitError(LakeError):
    """``commit`` found no staged changes on the branch and ``allow_empty`` was not set."""


class ConcurrentUpdateError(LakeError):
    """A branch head kept moving under a concurrent writer and the operation gave up retrying."""


class LakeUnavailableError(LakeError):
    """The lake did not answer usefully: server errors (5xx), timeouts or connection failures
    that persisted through every configured retry. Transient by nature: the same call may
    succeed later, so a Dagster ``RetryPolicy`` or a run retry is the right response; the
    message says whether a write may have been applied (an unanswered POST)."""


class LakeAuthError(LakeError, PermissionError):
    """The lake refused the credentials (401) or the permission (403). Never retried: the
    configuration or the access policy must change. Messages never include the secret."""
