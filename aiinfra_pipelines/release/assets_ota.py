"""``ota_release`` (group ``release``): the TUF repository vehicles update from.

Runs after each rollout decision (a stage advanced, a rollback, a full rollout): the targets
then list production for everyone plus the candidate for its cohort, or production alone.
Every run also re-signs the short-lived timestamp, so running it on a schedule shorter than
the timestamp expiry (``resources/release.yaml``) keeps vehicles' metadata fresh. An engine
that is not certified — or whose certificate no longer verifies — fails the run before
anything is signed.
"""

import dagster as dg

from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import root_run_id_of

from .keys import ReleaseKeys
from .ota import OtaRefused, plan_offers
from .ota_signing import publish_ota_repository

GROUP = "release"


@dg.asset(group_name=GROUP, kinds={"lakefs", "tuf"}, deps=["rollout"])
def ota_release(
    context: dg.AssetExecutionContext, lake: VersionedLake, release_keys: ReleaseKeys
) -> dg.MaterializeResult:
    """Signed TUF metadata listing the certified production (and rollout candidate) engines."""
    try:
        offers = plan_offers(lake, release_keys.certificate_public_key())
    except OtaRefused as refused:
        raise dg.Failure(
            description=str(refused),
            metadata={"problems": dg.MetadataValue.json(refused.problems)},
            allow_retries=False,
        ) from refused
    publication = publish_ota_repository(
        lake, release_keys, offers, root_run_id=root_run_id_of(context.run)
    )
    rows = "\n".join(
        f"| `{path}` | {custom['channel']} | {custom['model_version']} | "
        f"{custom.get('cohort_percent', '') or ''} | `{custom['engine_sha256'][:16]}` |"
        for path, custom in sorted(publication.targets.items())
    )
    return dg.MaterializeResult(
        metadata={
            "versions": dg.MetadataValue.json(publication.versions),
            "resigned": dg.MetadataValue.json(publication.resigned),
            "engines": dg.MetadataValue.json(
                {offer.channel: offer.model_version for offer in offers}
            ),
            "uncovered": dg.MetadataValue.json(publication.uncovered),
            "publish_commit": publication.commit,
            "targets": dg.MetadataValue.md(
                "| target | channel | model version | cohort % | sha256 |\n"
                "| --- | --- | --- | --- | --- |\n" + rows
            ),
        },
        data_version=dg.DataVersion(f"timestamp-v{publication.versions['timestamp']}"),
    )
