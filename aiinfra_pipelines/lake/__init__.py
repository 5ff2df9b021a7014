"""The versioned data lake: one port, a local and a lakeFS adapter, and the IO manager."""

from aiinfra_pipelines.lake.errors import (
    BranchExistsError,
    ConcurrentUpdateError,
    InvalidKeyError,
    LakeAuthError,
    LakeError,
    LakeUnavailableError,
    MergeConflictError,
    NotFoundError,
    NothingToCommitError,
    TagExistsError,
)
from aiinfra_pipelines.lake.keys import (
    validate_branch_name,
    validate_key,
    validate_prefix,
    validate_tag_name,
)
from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.lake.port import (
    BranchInfo,
    CommitInfo,
    DiffEntry,
    ObjectStat,
    VersionedLake,
)

__all__ = [
    "MAIN_BRANCH",
    "BranchExistsError",
    "BranchInfo",
    "CommitInfo",
    "ConcurrentUpdateError",
    "DiffEntry",
    "InvalidKeyError",
    "LakeAuthError",
    "LakeError",
    "LakeFSLake",
    "LakeUnavailableError",
    "LocalLake",
    "MergeConflictError",
    "NotFoundError",
    "NothingToCommitError",
    "ObjectStat",
    "TagExistsError",
    "VersionedLake",
    "validate_branch_name",
    "validate_key",
    "validate_prefix",
    "validate_tag_name",
]


def __getattr__(name: str):
    # The lakeFS SDK takes seconds to import; only deployments that use it should pay for it.
    if name == "LakeFSLake":
        from aiinfra_pipelines.lake.lakefs import LakeFSLake

        return LakeFSLake
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
