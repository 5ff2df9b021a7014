"""Resources that hold secrets never show them in ``repr``/``str`` (which reach logs and errors)."""

from __future__ import annotations

import pytest

from aiinfra_pipelines.ingest.resources import AnonymizationKey
from aiinfra_pipelines.lake.lakefs import LakeFSLake
from aiinfra_pipelines.release.keys import ReleaseKeys

SECRET = "5ec7e7" * 8


@pytest.mark.parametrize(
    "resource",
    [
        AnonymizationKey(key_hex=SECRET),
        LakeFSLake(
            repository="drive-data",
            endpoint="http://lakefs.invalid:8000",
            access_key_id=SECRET,
            secret_access_key=SECRET,
        ),
        ReleaseKeys(
            certificate_key=SECRET,
            tuf_root_key=SECRET,
            tuf_targets_key=SECRET,
            tuf_snapshot_key=SECRET,
            tuf_timestamp_key=SECRET,
        ),
    ],
    ids=lambda resource: type(resource).__name__,
)
def test_secrets_stay_out_of_repr_and_str(resource):
    assert SECRET not in repr(resource)
    assert SECRET not in str(resource)
