"""Process entry points for the LocalLake concurrency tests.

Kept out of the test modules so a ``spawn``-ed child imports only this and the lake package.
"""

from __future__ import annotations

from typing import Any

from aiinfra_pipelines.lake.local import LocalLake


def put_and_commit(root: str, tag: str, count: int, barrier: Any, results: Any) -> None:
    """Stage and commit ``count`` files on ``main``; report ``(tag, [commit ids])``.

    ``allow_empty=True`` because staging is shared per branch (as in lakeFS): the other
    process's commit may already have swept this process's staged file into its own commit.
    """
    lake = LocalLake(root=root)
    barrier.wait()  # start together so the commits really interleave
    ids: list[str] = []
    for i in range(count):
        lake.put_text("main", f"{tag}/{i:03d}.txt", f"{tag}-{i}")
        ids.append(lake.commit("main", f"{tag} {i}", {"writer": tag}, allow_empty=True))
    results.put((tag, ids))
