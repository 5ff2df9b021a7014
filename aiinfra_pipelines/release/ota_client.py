"""The vehicle side of OTA: ``tuf.ngclient`` downloads and verifies the engine a car should run.

A vehicle holds a trusted root (provisioned at the factory) and a persistent metadata cache;
``tuf.ngclient.Updater`` walks root → timestamp → snapshot → targets, checking signatures,
thresholds, expiry and that no version ever goes backwards, then checks the engine's length
and SHA-256 against the signed targets entry. Failures surface as ``OtaVerificationError``
naming the vehicle, with the library's own ``tuf.api.exceptions`` as its ``reason``
(``ExpiredMetadataError``, ``BadVersionNumberError``, ``LengthOrHashMismatchError``,
``UnsignedMetadataError``…): a car installs nothing unless all of it holds.

The repository is read straight from the lake (``LakeFetcher``): the lake is where the
repository lives, so a vehicle simulator needs no export step or HTTP server, and a real
deployment swaps in tuf's HTTP fetcher against the same layout (``ota/metadata/``,
``ota/targets/``) served over the lakeFS S3 gateway or a CDN.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuf.api import exceptions
from tuf.ngclient import Updater
from tuf.ngclient.fetcher import FetcherInterface

from aiinfra_pipelines.lake.errors import NotFoundError
from aiinfra_pipelines.lake.layout import MAIN_BRANCH, OTA_METADATA_PREFIX, OTA_TARGETS_PREFIX
from aiinfra_pipelines.lake.port import VersionedLake

from .cohorts import in_cohort
from .ota import CANDIDATE_CHANNEL, PRODUCTION_CHANNEL, target_path
from .ota_signing import trigger_target_path

LAKE_SCHEME = "lake://"


class OtaClientError(RuntimeError):
    """The repository offers no engine for this vehicle (nothing verified to install)."""


class OtaVerificationError(OtaClientError):
    """The repository failed TUF verification: a bad signature, a snapshot that does not match
    targets, a version going backwards, expired metadata, a tampered file.

    The vehicle installs nothing and keeps the engine and targets metadata it trusted (tuf
    stores only metadata that verified). ``reason`` is tuf's own exception
    (``tuf.api.exceptions``), for a caller that tells the kinds apart; the message names the
    vehicle and tuf's reason.
    """

    def __init__(self, vin: str, action: str, reason: exceptions.RepositoryError) -> None:
        super().__init__(f"VIN {vin}: OTA {action} refused: {type(reason).__name__}: {reason}")
        self.vin = vin
        self.action = action
        self.reason = reason

    def __reduce__(self):  # type: ignore[override]
        return (self.__class__, (self.vin, self.action, self.reason))


class LakeFetcher(FetcherInterface):
    """Serves ``lake://<key>`` URLs from one ref of the lake; a missing key is an HTTP 404,
    which is how the TUF client learns that no newer root exists."""

    def __init__(self, lake: VersionedLake, ref: str = MAIN_BRANCH) -> None:
        self.lake = lake
        self.ref = ref

    def _fetch(self, url: str) -> Iterator[bytes]:
        if not url.startswith(LAKE_SCHEME):
            raise exceptions.DownloadError(f"not a lake URL: {url}")
        key = url[len(LAKE_SCHEME) :]
        try:
            data = self.lake.get_object(self.ref, key)
        except NotFoundError:
            raise exceptions.DownloadHTTPError(f"{key} not found on {self.ref}", 404) from None
        return iter([data])


@dataclass(frozen=True)
class VerifiedEngine:
    """An engine file the TUF client verified, and what its signed target entry says."""

    path: Path
    channel: str
    model_version: str
    sha256: str
    length: int
    custom: dict[str, Any]

    def read_bytes(self) -> bytes:
        return self.path.read_bytes()


@dataclass(frozen=True)
class VerifiedTriggerConfig:
    """A trigger config document the TUF client verified (load it with
    ``TriggerConfig.load(config=document)``) and its signed target entry's custom data."""

    path: Path
    version: str
    sha256: str
    custom: dict[str, Any]

    def document(self) -> dict[str, Any]:
        return json.loads(self.path.read_bytes())


class VehicleUpdater:
    """One vehicle's OTA client: VIN, vehicle model, engine target and its local TUF state.

    ``cache_dir`` must persist between updates (as it does on the car): it holds the trusted
    metadata that lets the client detect a rollback to an older repository version.
    """

    def __init__(
        self,
        lake: VersionedLake,
        *,
        vin: str,
        vehicle_model: str,
        engine_target: str,
        trusted_root: bytes,
        cache_dir: str | Path,
        engine_filename: str | None = None,
        ref: str = MAIN_BRANCH,
    ) -> None:
        from .ota import OtaSettings

        self.lake = lake
        self.vin = vin
        self.vehicle_model = vehicle_model
        self.engine_target = engine_target
        self.cache_dir = Path(cache_dir)
        self.engine_filename = engine_filename or OtaSettings.load().engine_filename
        self.fetcher = LakeFetcher(lake, ref)
        self._trusted_root = trusted_root

    def _updater(self) -> Updater:
        metadata_dir = self.cache_dir / "metadata"
        target_dir = self.cache_dir / "targets"
        metadata_dir.mkdir(parents=True, exist_ok=True)
        target_dir.mkdir(parents=True, exist_ok=True)
        # The provisioned root is the anchor on every update (tuf's recommendation); newer,
        # rotated roots the car already accepted are replayed from its cache's root history.
        return Updater(
            metadata_dir=str(metadata_dir),
            metadata_base_url=f"{LAKE_SCHEME}{OTA_METADATA_PREFIX}",
            target_dir=str(target_dir),
            target_base_url=f"{LAKE_SCHEME}{OTA_TARGETS_PREFIX}",
            fetcher=self.fetcher,
            bootstrap=self._trusted_root,
        )

    @contextmanager
    def _refusing(self, action: str) -> Iterator[None]:
        """tuf's verification failures (``RepositoryError`` and its kinds) as this project's
        ``OtaVerificationError``, naming the vehicle and keeping tuf's reason. Download
        failures (``DownloadError``: unreachable, missing file) are not verification and pass
        through unchanged."""
        try:
            yield
        except exceptions.RepositoryError as error:
            raise OtaVerificationError(self.vin, action, error) from error

    def update(self) -> VerifiedEngine:
        """Refresh the metadata and return the verified engine this vehicle should run.

        The candidate when its target exists and this VIN is in the cohort; production
        otherwise. Raises ``OtaVerificationError`` on any verification failure (a bad
        signature, a snapshot that does not match targets, a version going backwards, expiry,
        a tampered engine file) and ``OtaClientError`` when the repository lists no engine for
        this vehicle; either way nothing is installed.
        """
        with self._refusing("engine update"):
            return self._update()

    def _update(self) -> VerifiedEngine:
        updater = self._updater()
        updater.refresh()
        paths = {
            channel: target_path(
                self.vehicle_model, self.engine_target, channel, self.engine_filename
            )
            for channel in (CANDIDATE_CHANNEL, PRODUCTION_CHANNEL)
        }
        chosen = None
        candidate = updater.get_targetinfo(paths[CANDIDATE_CHANNEL])
        if candidate is not None:
            custom = candidate.custom or {}
            # The same rule the rollout layer splits telemetry by (release/cohorts.py).
            if in_cohort(self.vin, float(custom["cohort_percent"]), str(custom["cohort_salt"])):
                chosen = candidate
        if chosen is None:
            chosen = updater.get_targetinfo(paths[PRODUCTION_CHANNEL])
        if chosen is None:
            raise OtaClientError(
                f"no engine published for {self.vehicle_model}/{self.engine_target} "
                f"(VIN {self.vin})"
            )
        local = updater.find_cached_target(chosen) or updater.download_target(chosen)
        custom = dict(chosen.custom or {})
        return VerifiedEngine(
            path=Path(local),
            channel=str(custom.get("channel", "")),
            model_version=str(custom.get("model_version", "")),
            sha256=chosen.hashes["sha256"],
            length=chosen.length,
            custom=custom,
        )

    def trigger_config(self) -> VerifiedTriggerConfig | None:
        """Refresh the metadata and return the verified trigger config for this vehicle model.

        ``None`` when the repository lists none (the car keeps the config it shipped with);
        ``OtaVerificationError`` on any verification failure, so a tampered document never
        loads.
        """
        with self._refusing("trigger config update"):
            return self._trigger_config()

    def _trigger_config(self) -> VerifiedTriggerConfig | None:
        updater = self._updater()
        updater.refresh()
        info = updater.get_targetinfo(trigger_target_path(self.vehicle_model))
        if info is None:
            return None
        local = updater.find_cached_target(info) or updater.download_target(info)
        custom = dict(info.custom or {})
        return VerifiedTriggerConfig(
            path=Path(local),
            version=str(custom.get("trigger_config_version", "")),
            sha256=info.hashes["sha256"],
            custom=custom,
        )
