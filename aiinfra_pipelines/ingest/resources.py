"""Resources the ingestion layer needs beyond the lake."""

from __future__ import annotations

import dagster as dg
from pydantic import Field

from aiinfra_pipelines.config import dagster_home, settings_section
from aiinfra_pipelines.logs.anonymize import load_or_create_dev_key

DEV_KEY_PATH = ("keys", "anonymization.key")


class AnonymizationKey(dg.ConfigurableResource):
    """The HMAC key that turns VINs into pseudonyms.

    In every shared environment it comes from ``AIINFRA_ANON_KEY`` (hex) through ``dg.EnvVar``;
    on a laptop an empty value means "use the dev key generated under ``DAGSTER_HOME``", which
    is git-ignored so no key is ever committed.
    """

    # Never shown by repr()/str(): a resource's repr ends up in logs and error messages.
    key_hex: str = Field(default="", repr=False)
    # Shared environments must never fall back to a per-machine dev key: pseudonyms would stop
    # matching across workers and the key would vanish with the pod.
    require_key: bool = False

    def key(self) -> bytes:
        if self.key_hex:
            try:
                key = bytes.fromhex(self.key_hex)
            except ValueError as error:
                raise ValueError("AIINFRA_ANON_KEY must be a hex string") from error
            minimum = settings_section("logs.yaml", "anonymization").int("min_key_bytes")
            if len(key) < minimum:
                raise ValueError(f"AIINFRA_ANON_KEY is {len(key)} bytes; at least {minimum} needed")
            return key
        if self.require_key:
            raise ValueError("AIINFRA_ANON_KEY is required in this environment and is empty")
        return load_or_create_dev_key(dagster_home().joinpath(*DEV_KEY_PATH))
