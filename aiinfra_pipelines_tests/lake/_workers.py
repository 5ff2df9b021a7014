"""Process entry points for the LocalLake concurrency tests.

Kept out of the test modules so a ``spawn``-ed child imports only this and the lake package.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from aiinfra_pipelines.lake.local import LocalLake
from aiinfra_pipelines.lake.port import VersionedLake


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


def _peak_rss_kib() -> int:
    """This process's own resident-set high-water mark (``VmHWM``). Not ``ru_maxrss``: that
    survives fork and exec, so a child of a large pytest process would report the parent's."""
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1])


def file_transfer_peak_growth(root: str, source: str, destination: str) -> dict[str, int]:
    """Move ``source`` through a ``LocalLake`` at ``root`` every way a large file goes —
    ``upload_file``, ``download_object``, and the port's default ``upload_file`` (a resumable
    upload, completed by streaming its parts) — and return how far the peak RSS rose (KiB)
    after each step, over the peak after a small warm-up of the same calls."""
    lake = LocalLake(root=root)
    lake.ensure_repository()
    warm = Path(destination).with_name("warm-up.bin")
    warm.write_bytes(b"w" * 4096)
    lake.upload_file("main", "warm/a.bin", warm)
    lake.download_object("main", "warm/a.bin", warm)
    VersionedLake.upload_file(lake, "main", "warm/b.bin", warm)
    base = _peak_rss_kib()
    growth: dict[str, int] = {}
    lake.upload_file("main", "logs/big.mcap", source)
    growth["upload_file"] = _peak_rss_kib() - base
    lake.download_object("main", "logs/big.mcap", destination)
    growth["download_object"] = _peak_rss_kib() - base
    VersionedLake.upload_file(lake, "main", "logs/parts.mcap", source)
    growth["multipart"] = _peak_rss_kib() - base
    return growth
