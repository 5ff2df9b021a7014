"""Who a trained candidate is: its registry version and the lineage behind it.

Created by training (``trained_model``) and carried, unchanged, by every later layer: export,
quantization, simulation, certification and release name the candidate by it. It lives here,
in the layer that creates it, because a layer imports only from the layers before it.

Asset outputs stay plain JSON in the lake (the IO manager stores dicts), so the identity keeps
today's field names through ``to_dict``/``from_dict``.
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
