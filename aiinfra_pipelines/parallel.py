"""A pool of worker processes for CPU-bound Python work: ingesting logs, driving the fleet.

Decoding and validating a log, or stepping highway-env, is CPU-bound Python: threads would
share one core. Each worker takes one item at a time and should hand back only a small result
(an ingest worker returns a verdict, never the pixels), so memory stays bounded by the number
of workers. Results come back in input order as they finish, so the caller can report progress
while the pool works.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from aiinfra_pipelines.config import settings_section

Item = TypeVar("Item")
Result = TypeVar("Result")

# Per-process state the workers share (the lake, the anonymization key): set once per worker by
# the pool's initializer instead of being pickled with every task.
_STATE: dict[str, Any] = {}


def worker_state() -> dict[str, Any]:
    """What :func:`map_in_pool`'s ``state`` put in this process."""
    return _STATE


def _initialize(state: dict[str, Any]) -> None:
    _STATE.clear()
    _STATE.update(state)


def available_cores() -> int:
    """Cores this process may run on (a pod's cpuset, not the node's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class PoolSettings:
    workers: int
    start_method: str
    min_items_for_pool: int

    @classmethod
    def load(
        cls,
        resource_file: str,
        section: str = "workers",
        config: Mapping[str, Any] | None = None,
    ) -> PoolSettings:
        """From a ``workers`` block (``count``, ``start_method``, ``min_items_for_pool``) of
        ``resource_file`` (or of ``config``, that whole file as a mapping)."""
        block = settings_section(resource_file, section, config)
        count = block.int("count")
        if count < 0:
            raise block.error("count", f"must be >= 0, got {count}")
        return cls(
            workers=count or available_cores(),
            start_method=block.str("start_method"),
            min_items_for_pool=block.int("min_items_for_pool"),
        )


def map_in_pool(
    function: Callable[[Item], Result],
    items: Iterable[Item],
    state: dict[str, Any],
    settings: PoolSettings,
) -> Iterator[Result]:
    """``function`` over ``items`` on worker processes, results in input order.

    ``function`` must be a module-level function (workers import it) and reads shared objects
    from :func:`worker_state`. Small inputs, or one worker, run in this process.
    """
    work = list(items)
    if settings.workers <= 1 or len(work) < max(settings.min_items_for_pool, 2):
        _initialize(state)
        yield from map(function, work)
        return
    context = multiprocessing.get_context(settings.start_method)
    with ProcessPoolExecutor(
        max_workers=min(settings.workers, len(work)),
        mp_context=context,
        initializer=_initialize,
        initargs=(state,),
    ) as pool:
        yield from pool.map(function, work, chunksize=1)
