"""Curation assets for frame similarity: the index, and "more like this" from the launchpad.

``similarity_index`` follows mining's publishes (eager, but not held back by a batch whose
mining never published: it indexes what ``main`` has) and appends only new batches.
``more_like_this`` is launched by an operator with a frame; its result lands in the lake and
in the run's metadata.
"""

import dagster as dg
from pydantic import Field

from aiinfra_pipelines.lake.layout import MAIN_BRANCH
from aiinfra_pipelines.lake.port import VersionedLake
from aiinfra_pipelines.lake.publish import publish_objects, root_run_id_of
from aiinfra_pipelines.metadata_tables import table_metadata
from aiinfra_pipelines.mining.assets import published_mining
from aiinfra_pipelines.perception.contract import EMBEDDING_OUTPUT
from aiinfra_pipelines.perception.deployed import load_deployed_engine

from .similarity import UnknownFrameError
from .similarity_query import FrameSyntaxError, SimilarFrames, similar_frames
from .similarity_requests import MoreLikeThis
from .similarity_settings import SimilaritySettings
from .similarity_store import IndexUpdate, NoSimilarityIndexError, update_index

GROUP = "curation"
# Eager without "any dependency missing": the index reads main, and one batch whose mining
# failed must not stop every later batch from becoming searchable.
INDEX_AUTOMATION = (
    dg.AutomationCondition.eager()
    .without(~dg.AutomationCondition.any_deps_missing())
    .with_label("eager (whatever main has published)")
)
RESULT_ROWS_SHOWN = 50


def _index_metadata(update: IndexUpdate, engine_version: str) -> dict:
    state = update.state()
    return {
        "engine": engine_version,
        "engine_sha256": update.index.engine_sha,
        "metric": update.index.metric,
        "dim": update.index.dim,
        "frames_indexed": update.index.rows,
        "batches_indexed": len(update.index.batches),
        "update": "rebuilt" if update.rebuilt else "incremental",
        "reason": update.reason,
        "added_batches": dg.MetadataValue.json(list(update.added_batches)),
        "added_frames": update.added_rows,
        "other_engine_frames_left_out": state["other_engine_rows"],
        "source_commit": update.source_commit,
    }


@dg.asset(
    group_name=GROUP,
    kinds={"faiss", "lakefs"},
    deps=[published_mining],
    automation_condition=INDEX_AUTOMATION,
)
def similarity_index(
    context: dg.AssetExecutionContext, lake: VersionedLake
) -> dg.MaterializeResult:
    """Frame embeddings of the deployed engine, searchable by frame (cosine, exact).

    Appends the batches mining published since the last update; starts over when the deployed
    engine changed (its embeddings are another space). Only the deployed engine's embeddings
    are indexed — other engines' frames are counted, not mixed in — and the state names the
    main commit the index was built from, the commit every query reports.
    """
    deployed = load_deployed_engine(lake, batch_size=1)
    engine = deployed.engine
    if not engine.has_embedding:
        note = (
            f"not indexed: the deployed engine {deployed.version} ({engine.sha256[:12]}) has "
            f"no '{EMBEDDING_OUTPUT}' output; engines exported from now on carry it"
        )
        context.log.warning(note)
        return dg.MaterializeResult(metadata={"indexed": False, "note": note})
    update = update_index(lake, engine.sha256, int(engine.embedding_dim or 0))
    metadata = _index_metadata(update, deployed.version)
    if update.rebuilt or update.added_batches:
        metadata["commit"] = publish_objects(
            lake,
            root_run_id_of(context.run),
            update.objects(),
            f"similarity index: {update.reason}",
            {"kind": "similarity_index", "dagster_run_id": context.run.run_id},
        )
    else:
        metadata["commit"] = "unchanged (up to date)"
    return dg.MaterializeResult(metadata={"indexed": True, **metadata})


class MoreLikeThisConfig(dg.Config):
    """A "more like this" request: the frame, and how many neighbours."""

    frame: str = Field(description="the frame to match, as <log_id>:<frame_index>")
    k: int = Field(
        default=SimilaritySettings.load().default_k,
        description="neighbours to return (the frame itself included, nearest first)",
    )


def _result_table(result: SimilarFrames) -> dg.TableMetadataValue:
    return table_metadata(
        [
            {
                "rank": int(row.rank),
                "frame": str(row.frame),
                "distance": round(float(row.distance), 6),
                "slice": str(row.slice),
                "events": ", ".join(row.events),
            }
            for row in result.rows.head(RESULT_ROWS_SHOWN).itertuples(index=False)
        ],
        columns=("rank", "frame", "distance", "slice", "events"),
    )


@dg.asset(group_name=GROUP, kinds={"faiss", "lakefs"}, deps=[similarity_index])
def more_like_this(
    context: dg.AssetExecutionContext, config: MoreLikeThisConfig, lake: VersionedLake
) -> dg.MaterializeResult:
    """The frames most like ``config.frame`` in the similarity index on ``main``.

    Writes the result table and ``latest.json`` to the lake (the fleet scenario library adds
    the result's logs as scenario candidates) and shows it here as a table.
    """
    settings = SimilaritySettings.load()
    if not 1 <= config.k <= settings.max_k:
        raise dg.Failure(
            description=f"k must be in [1, {settings.max_k}], got {config.k}", allow_retries=False
        )
    try:
        result = similar_frames(lake, config.frame, config.k, MAIN_BRANCH)
    except (FrameSyntaxError, UnknownFrameError, NoSimilarityIndexError) as error:
        raise dg.Failure(description=str(error), allow_retries=False) from error
    request = MoreLikeThis(root_run_id_of(context.run), result, config.k)
    commit = publish_objects(
        lake,
        request.request_id,
        request.objects(),
        f"more like this: {result.query} (k={config.k})",
        {"kind": "more_like_this", "dagster_run_id": context.run.run_id},
    )
    return dg.MaterializeResult(
        metadata={
            "frame": result.query,
            "k": config.k,
            "neighbours": _result_table(result),
            "logs": dg.MetadataValue.json(request.pointer()["logs"]),
            "index_commit": result.index_commit,
            "engine_sha256": result.engine_sha,
            "metric": result.metric,
            "commit": commit,
        }
    )
