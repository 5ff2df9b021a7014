"""A demo starts from nothing: an earlier run's state is set aside, not built upon.

The demo is a pure function of ``resources/demo.yaml``: the same seed gives the same drives,
certifications and rollout decisions. A second ``make demo`` on the state of a first would
instead run cycles three and four on its lake. So the runtime state under ``DAGSTER_HOME`` (the
lake, runs, MLflow store, keys, the cars' outboxes) moves to ``previous/`` first — the last
run stays there to be inspected (one run back, so the disk does not fill), and the instance
configuration stays in place.
"""

from __future__ import annotations

import shutil
from pathlib import Path

PREVIOUS = "previous"
KEPT = frozenset({"dagster.yaml", "README.md", PREVIOUS})


def set_aside_previous_run(home: Path) -> Path | None:
    """Move ``home``'s runtime state into ``home/previous`` (replacing an older one); the
    folder it went to, or ``None`` when there was nothing to move."""
    entries = sorted(p for p in home.iterdir() if p.name not in KEPT) if home.is_dir() else []
    if not entries:
        return None
    previous = home / PREVIOUS
    if previous.exists():
        shutil.rmtree(previous)
    previous.mkdir()
    for entry in entries:
        shutil.move(str(entry), str(previous / entry.name))
    return previous
