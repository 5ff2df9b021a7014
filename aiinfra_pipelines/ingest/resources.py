"""Resources the ingestion layer needs beyond the lake."""

from __future__ import annotations

import dagster as dg

from aiinfra_pipelines.config import dagster_home
from aiinfra_pipelines.logs.anonymize import load_or_create_dev_key

DEV_KEY_PATH = ("keys", "anonymization.key")


class AnonymizationKey(dg.ConfigurableResource):
    """The HMAC key that turns VINs into pseudonyms.

    In every shared environment it comes from ``AIINFRA_ANON_KEY`` (hex) through ``dg.EnvVar``;
    on a laptop an empty value means "use the dev key generated under ``DAGSTER_HOME``", which
    is git-ignored so no key is ever committed.
    """

    key_hex: str = ""

    def key(self) -> bytes:
        if self.key_hex:
            try:
                return bytes.fromhex(self.key_hex)
            except ValueError as error:
                raise ValueError("AIINFRA_ANON_KEY must be a hex string") from error
        return load_or_create_dev_key(dagster_home().joinpath(*DEV_KEY_PATH))
