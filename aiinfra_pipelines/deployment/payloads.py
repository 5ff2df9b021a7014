"""Typed payloads that flow between the deployment assets (and on to simulation and release).

A candidate's identity is :class:`~aiinfra_pipelines.training.identity.CandidateIdentity`:
training creates it, and layers only import from the layers before them.

Asset outputs stay plain JSON in the lake (the IO manager stores dicts), so each payload keeps
today's field names through ``to_dict``/``from_dict``; inside the code the fields are named and
checked once, instead of every consumer indexing ``output["onnx"]["sha256"]`` and hoping.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StagedObject:
    """An object written on a run branch, pinned by the commit that holds it.

    Later steps read by ``commit``, not by branch: run branches are deleted once published,
    commits stay. ``sha256`` lets the reader refuse bytes that changed since staging.
    """

    key: str
    sha256: str
    size: int
    commit: str

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any]) -> StagedObject:
        """Read the staged fields of ``entry``; extra fields (an engine's plan…) are ignored."""
        return cls(
            key=entry["key"], sha256=entry["sha256"], size=entry["bytes"], commit=entry["commit"]
        )

    def to_dict(self) -> dict[str, Any]:
        """The on-lake form (``bytes`` is the size field's JSON name)."""
        return {"key": self.key, "sha256": self.sha256, "bytes": self.size, "commit": self.commit}

    def manifest_entry(self) -> dict[str, Any]:
        """What a candidate manifest records of the object: no commit, it is on ``main`` then."""
        return {"key": self.key, "sha256": self.sha256, "bytes": self.size}
