"""lakeFS API answers as the server sends them, to script ``http_fakes.FakeLakeFS``.

The shapes follow lakeFS's OpenAPI spec as generated into ``lakefs_sdk.models`` (``DiffList``,
``CommitList``, ``Pagination``, ``ObjectStats``, ``FindMergeBaseResult``, ``MergeResult``,
``Error``). The real SDK parses them with its strict pydantic models, so an answer missing a
field lakeFS always sends fails the test instead of passing on a shape lakeFS never produces.
"""

from __future__ import annotations

import re
from typing import Any

from aiinfra_pipelines_tests.support.http_fakes import FakeLakeFS, Reply, commit_json

REPOSITORY = "drive-data"
API = f"/api/v1/repositories/{REPOSITORY}"
MTIME = 1_700_000_000


def listing(results: list[dict[str, Any]], next_offset: str | None = None) -> dict[str, Any]:
    """One page of a lakeFS listing (diff, log, branches): more pages iff ``next_offset``."""
    return {
        "pagination": {
            "has_more": next_offset is not None,
            "next_offset": next_offset or "",
            "results": len(results),
            "max_per_page": 1000,
        },
        "results": results,
    }


def diff_json(
    path: str, change: str, size: int | None = None, path_type: str = "object"
) -> dict[str, Any]:
    """A ``Diff`` entry: ``change`` is added/removed/changed/conflict/prefix_changed."""
    entry: dict[str, Any] = {"type": change, "path": path, "path_type": path_type}
    if size is not None:
        entry["size_bytes"] = size
    return entry


def object_stats_json(path: str, checksum: str, size: int) -> dict[str, Any]:
    """An ``ObjectStats`` (``GET .../objects/stat``)."""
    return {
        "path": path,
        "path_type": "object",
        "physical_address": f"s3://bucket/{REPOSITORY}/data/{checksum}",
        "checksum": checksum,
        "size_bytes": size,
        "mtime": MTIME,
        "content_type": "application/octet-stream",
    }


def merge_base_json(source: str, destination: str, base: str) -> dict[str, Any]:
    """A ``FindMergeBaseResult`` (``GET .../refs/{source}/merge/{destination}``)."""
    return {
        "source_commit_id": source,
        "destination_commit_id": destination,
        "base_commit_id": base,
    }


def config_json() -> dict[str, Any]:
    """``GET /config``: an S3 blockstore without presigned URLs (reads go through the API)."""
    return {
        "storage_config": {
            "blockstore_type": "s3",
            "blockstore_namespace_example": "s3://example",
            "blockstore_namespace_ValidityRegex": "^s3://",
            "pre_sign_support": False,
            "pre_sign_support_ui": False,
            "import_support": False,
            "import_validity_regex": "^s3://",
        }
    }


def error(status: int, message: str) -> Reply:
    """An ``Error`` answer, as lakeFS writes every failure."""
    return Reply(status, {"message": message})


def resolves(fake: FakeLakeFS, ref: str, commit_id: str, parents: list[str] | None = None) -> None:
    """``ref`` (branch, tag or commit id) resolves to commit ``commit_id``."""
    fake.route(
        "GET",
        f"{API}/commits/{re.escape(ref)}",
        then=Reply(200, commit_json(commit_id, parents)),
    )


def clean_branch(fake: FakeLakeFS, branch: str) -> None:
    """``branch`` has no uncommitted changes (``GET .../branches/{branch}/diff`` is empty)."""
    fake.route("GET", f"{API}/branches/{re.escape(branch)}/diff", then=Reply(200, listing([])))


def two_dot_diff(fake: FakeLakeFS, left: str, right: str, entries: list[dict[str, Any]]) -> None:
    """The ``left..right`` diff of two commit ids, in one page."""
    fake.route(
        "GET",
        f"{API}/refs/{re.escape(left)}/diff/{re.escape(right)}",
        then=Reply(200, listing(entries)),
        query={"type": "two_dot"},
    )


def stat(fake: FakeLakeFS, ref: str, path: str, checksum: str, size: int = 2) -> None:
    """``path`` at ``ref`` has ``checksum``."""
    fake.route(
        "GET",
        f"{API}/refs/{re.escape(ref)}/objects/stat",
        then=Reply(200, object_stats_json(path, checksum, size)),
        query={"path": path},
    )
