"""Release sensors: telemetry lands → ``fleet_telemetry``; certified → shadow → rollout stages.

``telemetry_sensor`` watches ingest branches for telemetry uploads (one run per batch and
landed head, like the ingest sensor for logs). ``rollout_sensor`` closes the release loop:

* a certified candidate (certificate on main) with no rollout state, newer than every
  candidate that has one, starts shadow: ``shadow_report``, run key ``shadow-<v>``;
* a candidate whose shadow passed starts its first stage once no other rollout is active, or
  at once when its gates were judged against the active rollout's release (it supersedes it:
  run key ``rollout-<v>-supersedes-<active>``);
* the active rollout is re-judged when *fresh* telemetry was published (a telemetry commit on
  main it has not decided on): ``rollout``, run key ``rollout-<v>-<stage>-<telemetry commit>``;
* nothing is requested for ``awaiting_approval`` beyond safety re-checks on fresh telemetry
  (a person approves the next stage with run config), nor for completed/rolled-back ones.

Run keys name exactly what triggers the run, so a repeated tick, a lost cursor or a restarted
daemon requests nothing twice (Dagster drops a repeated run key; the cursor remembers recent
keys so a test or a tick never even returns one twice). While a release run is queued or
running, the sensor waits: that run's outcome changes what should happen next.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import dagster as dg

from aiinfra_pipelines.lake.layout import CANDIDATES_PREFIX, MAIN_BRANCH
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.operations.assets import fleet_telemetry, telemetry_batches
from aiinfra_pipelines.operations.landing import discover_telemetry
from aiinfra_pipelines.release.assets_ota import ota_release
from aiinfra_pipelines.release.assets_rollout import rollout, shadow_report
from aiinfra_pipelines.release.reference import gated_against
from aiinfra_pipelines.release.rollout import may_supersede
from aiinfra_pipelines.release.rollout_state import SHADOW
from aiinfra_pipelines.release.rollout_store import active_rollout, list_states, version_order
from aiinfra_pipelines.release.rollout_telemetry import (
    latest_telemetry_commit,
    next_telemetry_commit,
)
from aiinfra_pipelines.runs import (
    GROUP_TAG,
    IN_FLIGHT,
    MODEL_VERSION_TAG,
    RELEASE_STEP_TAG,
    SOURCE_COMMIT_TAG,
    TRIGGER_TAG,
)

from .settings import SensorSettings


@dataclass(frozen=True)
class ReleaseRequest:
    """One run the release loop needs now: which asset, for which candidate, and why."""

    asset: str
    model_version: str
    run_key: str
    reason: str

    def run_request(self) -> dg.RunRequest:
        # A rollout decision changes which engine each cohort should install, so the same run
        # re-signs the OTA repository (``ota_release``) right after it.
        selection = [dg.AssetKey(self.asset)]
        if self.asset == "rollout":
            selection.append(dg.AssetKey("ota_release"))
        return dg.RunRequest(
            run_key=self.run_key,
            asset_selection=selection,
            run_config={"ops": {self.asset: {"config": {"model_version": self.model_version}}}},
            tags={
                RELEASE_STEP_TAG: self.asset,
                MODEL_VERSION_TAG: self.model_version,
                TRIGGER_TAG: self.reason[:200],
            },
        )


def certified_versions(lake: VersionedLake) -> list[str]:
    """Model versions with a certificate on main, oldest first."""
    versions = {
        stat.key[len(CANDIDATES_PREFIX) :].split("/", 1)[0]
        for stat in lake.list_objects(MAIN_BRANCH, prefix=CANDIDATES_PREFIX)
        if stat.key.endswith("/certificate.json")
    }
    return sorted(versions, key=version_order)


def plan_release_requests(lake: VersionedLake) -> list[ReleaseRequest]:
    """What the release loop should run now, from main alone (the sensor's whole logic)."""
    lake.ensure_repository()
    states = {state.model_version: state for state in list_states(lake)}
    newest_tracked = max(states, key=version_order, default=None)
    requests: list[ReleaseRequest] = []
    fresh = [
        version
        for version in certified_versions(lake)
        if version not in states
        and (newest_tracked is None or version_order(version) > version_order(newest_tracked))
    ]
    if fresh:
        version = fresh[-1]
        requests.append(
            ReleaseRequest(
                "shadow_report", version, f"shadow-{version}", f"model version {version} certified"
            )
        )
    active = active_rollout(list(states.values()))
    ready = [state for state in states.values() if state.status == SHADOW and state.shadow_passed]
    if active is not None and ready:
        version = ready[-1].model_version
        if may_supersede(version, active, gated_against(lake, version)):
            requests.append(
                ReleaseRequest(
                    "rollout",
                    version,
                    f"rollout-{version}-supersedes-{active}",
                    f"shadow of model version {version} passed and its gates were judged "
                    f"against rollout {active}: it takes the fleet over",
                )
            )
            return requests
    if active is not None:
        state = states[active]
        # The publish the rollout judges next (oldest first, one per run): the run key names
        # it, so a tick that finds two new batches asks for the first, the next tick the second.
        judged = next_telemetry_commit(lake, after=state.last_telemetry_commit)
        if judged is not None and judged != state.last_telemetry_commit:
            requests.append(
                ReleaseRequest(
                    "rollout",
                    active,
                    f"rollout-{active}-{state.stage}-{judged}",
                    f"fresh telemetry {judged[:12]} for rollout {active} ({state.stage})",
                )
            )
        return requests
    if ready:
        version = ready[-1].model_version
        requests.append(
            ReleaseRequest(
                "rollout",
                version,
                f"rollout-{version}-shadow-{latest_telemetry_commit(lake) or 'none'}",
                f"shadow of model version {version} passed: start the first stage",
            )
        )
    return requests


def _remembered(cursor: str | None) -> list[str]:
    if not cursor:
        return []
    parsed = json.loads(cursor)
    if not isinstance(parsed, list):
        raise ValueError(f"rollout sensor cursor must be a JSON list of run keys, got {cursor!r}")
    return [str(key) for key in parsed]


@dg.sensor(
    name="rollout_sensor",
    target=[shadow_report, rollout, ota_release],
    minimum_interval_seconds=SensorSettings.load().rollout_interval_s,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Certified candidate → shadow_report; shadow passed → first stage; fresh "
    "telemetry → the active rollout's next decision. Stops at awaiting_approval.",
)
def rollout_sensor(
    context: dg.SensorEvaluationContext, lake: VersionedLake
) -> dg.SensorResult | dg.SkipReason:
    in_flight = [
        run
        for step in ("shadow_report", "rollout")
        for run in context.instance.get_runs(
            filters=dg.RunsFilter(tags={RELEASE_STEP_TAG: step}, statuses=IN_FLIGHT), limit=1
        )
    ]
    if in_flight:
        return dg.SkipReason(f"release run {in_flight[0].run_id} is still in flight")
    remembered = _remembered(context.cursor)
    requests = [r for r in plan_release_requests(lake) if r.run_key not in remembered]
    if not requests:
        return dg.SkipReason("nothing to release: no new certificate, no fresh telemetry")
    for request in requests:
        context.log.info(f"requesting {request.asset} ({request.run_key}): {request.reason}")
    keep = SensorSettings.load().remembered_run_keys
    return dg.SensorResult(
        run_requests=[request.run_request() for request in requests],
        cursor=json.dumps((remembered + [r.run_key for r in requests])[-keep:]),
    )


@dg.sensor(
    name="telemetry_sensor",
    target=[fleet_telemetry],
    minimum_interval_seconds=SensorSettings.load().telemetry_interval_s,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Watches ingest branches for telemetry uploads; one fleet_telemetry run per "
    "batch and landed head.",
)
def telemetry_sensor(context: dg.SensorEvaluationContext, lake: VersionedLake) -> dg.SensorResult:
    cursor = json.loads(context.cursor) if context.cursor else {}
    batches, next_cursor = discover_telemetry(lake, cursor)
    if batches:
        context.log.info(f"{len(batches)} telemetry batch(es) landed or changed")
    return dg.SensorResult(
        run_requests=[
            dg.RunRequest(
                run_key=batch.run_key,
                partition_key=batch.partition_key,
                tags={SOURCE_COMMIT_TAG: batch.commit, GROUP_TAG: "operations"},
            )
            for batch in batches
        ],
        dynamic_partitions_requests=(
            [telemetry_batches.build_add_request(sorted({b.partition_key for b in batches}))]
            if batches
            else []
        ),
        cursor=json.dumps(next_cursor, sort_keys=True),
    )
