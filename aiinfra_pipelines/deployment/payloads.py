"""Typed payloads that flow between the deployment assets (and on to simulation and release).

Asset outputs stay plain JSON in the lake (the IO manager stores dicts), so each payload keeps
today's field names through ``to_dict``/``from_dict``; inside the code the fields are named and
checked once, instead of every consumer indexing ``output["onnx"]["sha256"]`` and hoping.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class CandidateIdentity:
    """Who a candidate model/engine is: its registry version and the lineage behind it.

    Values are kept as the producer wrote them (``from_dict`` does not coerce), so the JSON a
    round trip writes is byte-for-byte what the producer's dict would have written.
    """

    model_version: str
    registered_model: str = ""
    mlflow_run_id: str = ""
    model_uri: str = ""
    dataset_version: str = ""
    dataset_commit: str = ""
    code_version: str = ""

    @classmethod
    def from_dict(cls, model: Mapping[str, Any]) -> CandidateIdentity:
        """The identity fields of a ``trained_model`` output (or anything carrying them).

        Refuses a model without a registry version: nothing downstream could name it.
        """
        if not model.get("model_version"):
            raise ValueError(
                "the trained model has no registry version (model_version): it was trained "
                "before registration existed; retrain it so the candidate has an identity"
            )
        return cls(**{name: model.get(name, "") for name in IDENTITY_FIELDS})

    def to_dict(self) -> dict[str, Any]:
        """The on-lake form: one key per identity field, in declaration order."""
        return {name: getattr(self, name) for name in IDENTITY_FIELDS}


IDENTITY_FIELDS: tuple[str, ...] = tuple(field.name for field in fields(CandidateIdentity))


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
