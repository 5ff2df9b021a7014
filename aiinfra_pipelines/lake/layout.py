"""Where things live in the ``drive-data`` repository — the contract between uploaders and us.

Raw MCAP logs land under ``logs/`` on ``ingest-<batch>`` branches (lakeFS branch names allow no
slash). Raw logs carry PII and are never merged; ``main`` receives only derived, anonymized data.
"""

INGEST_BRANCH_PREFIX = "ingest-"
LOG_PREFIX = "logs/"
LOG_SUFFIX = ".mcap"
# What else a car uploads beside its logs, under ``logs/`` so that discovery sees one prefix:
# the index record of a segment it kept raw only in its cache (``vehicle.index_only``), and
# the notice that a pulled segment can no longer be sent (evicted from that cache).
INDEX_RECORD_SUFFIX = ".index.json"
PULL_NOTICE_SUFFIX = ".unservable.json"
UPLOAD_SUFFIXES = (LOG_SUFFIX, INDEX_RECORD_SUFFIX, PULL_NOTICE_SUFFIX)
# Requests for raw segments the fleet holds (one object per segment, on ``main``): opened by
# an operator or mining, served or closed by the ingest of what the cars sent back.
PULLS_PREFIX = "pulls/"

# The release layer moves this pointer (on ``main``) when an engine becomes production; every
# consumer of "the deployed engine" (mining, the fleet, shadow mode) reads it.
PRODUCTION_POINTER_KEY = "release/production.json"
# Versioned datasets: one folder per version; ``latest.json`` names the newest.
DATASETS_PREFIX = "datasets/"

# The one branch every reader trusts: only merges of audited run branches reach it.
MAIN_BRANCH = "main"

# Candidates: one folder per model version (engines, gate reports, manifest, certificate);
# ``latest.json`` names the newest published one. Deployment writes it, simulation and
# certification read it, so the key shape is defined once, here.
CANDIDATES_PREFIX = "candidates/"
LATEST_CANDIDATE_KEY = f"{CANDIDATES_PREFIX}latest.json"


def candidate_prefix(model_version: str) -> str:
    """The folder of one candidate; everything certified about it lives below."""
    return f"{CANDIDATES_PREFIX}{model_version}/"


def candidate_manifest_key(model_version: str) -> str:
    return f"{candidate_prefix(model_version)}manifest.json"


def candidate_report_key(model_version: str, gate: str) -> str:
    return f"{candidate_prefix(model_version)}reports/{gate}.json"


def candidate_certificate_key(model_version: str) -> str:
    return f"{candidate_prefix(model_version)}certificate.json"


def candidate_engine_key(model_version: str, precision: str) -> str:
    return f"{candidate_prefix(model_version)}{precision}.onnx"


# Rollouts: one state document per model version; ``current.json`` names the active one. The
# OTA repository reads the same pointer to decide what the candidate channel carries.
ROLLOUT_PREFIX = "release/rollout/"
CURRENT_ROLLOUT_KEY = f"{ROLLOUT_PREFIX}current.json"


def rollout_state_key(model_version: str) -> str:
    return f"{ROLLOUT_PREFIX}{model_version}.json"


# Validated fleet telemetry on ``main`` (one Parquet per batch): operations writes it, the
# rollout judges cohorts on it.
PUBLISHED_TELEMETRY_PREFIX = "telemetry/records/"

# The TUF repository cars update from: signed role metadata and content-addressed targets.
OTA_PREFIX = "ota/"
OTA_METADATA_PREFIX = f"{OTA_PREFIX}metadata/"
OTA_TARGETS_PREFIX = f"{OTA_PREFIX}targets/"


def training_rows_key(dataset_version: str) -> str:
    """The rows (log, frame, split, frames object) of one training dataset version."""
    return f"{DATASETS_PREFIX}training/{dataset_version}/dataset.parquet"


def training_transfer_key(dataset_version: str) -> str:
    """The transfer set of one training dataset version: rows of frames without usable labels,
    which a student learns from its teacher alone (``datasets.selection.transfer_rows``)."""
    return f"{DATASETS_PREFIX}training/{dataset_version}/transfer.parquet"


def training_manifest_key(dataset_version: str) -> str:
    """The manifest of one training dataset version (at the commit its tag points at)."""
    return f"{DATASETS_PREFIX}training/{dataset_version}/manifest.json"


# Retention (operations): every plan a run computed, and every approved deletion with what it
# removed, kept on ``main`` as the audit trail of what raw data left the lake and who said so.
RETENTION_PREFIX = "operations/retention/"


def retention_plan_key(stamp: str, digest: str) -> str:
    return f"{RETENTION_PREFIX}plans/{stamp}-{digest[:16]}.json"


def retention_approval_key(stamp: str, digest: str) -> str:
    return f"{RETENTION_PREFIX}approvals/{stamp}-{digest[:16]}.json"


# Trigger config proposals (curation proposes, a person approves, release ships them as signed
# OTA targets): one document per proposed version, ``latest.json`` names the newest (an older
# proposal is superseded and can no longer be approved), one approval record per version.
TRIGGER_PROPOSALS_PREFIX = "release/triggers/proposals/"
LATEST_TRIGGER_PROPOSAL_KEY = f"{TRIGGER_PROPOSALS_PREFIX}latest.json"
TRIGGER_APPROVALS_PREFIX = "release/triggers/approvals/"


def trigger_proposal_key(version: str) -> str:
    return f"{TRIGGER_PROPOSALS_PREFIX}{version}.json"


def trigger_approval_key(version: str) -> str:
    return f"{TRIGGER_APPROVALS_PREFIX}{version}.json"


# Frame similarity (curation): the index over one engine's frame embeddings, kept on ``main``
# so each update appends only batches published since. ``state.json`` names the engine, the
# batches indexed (with their objects' checksums) and the commit whose embeddings it holds.
SIMILARITY_PREFIX = "curation/similarity/"
SIMILARITY_STATE_KEY = f"{SIMILARITY_PREFIX}state.json"
SIMILARITY_INDEX_KEY = f"{SIMILARITY_PREFIX}index.faiss"
SIMILARITY_KEYS_KEY = f"{SIMILARITY_PREFIX}keys.parquet"
# "More like this" requests from the launchpad: one result table per request, ``latest.json``
# names the newest (the fleet scenario library grows from it).
MORE_LIKE_THIS_PREFIX = "curation/more_like_this/"
LATEST_MORE_LIKE_THIS_KEY = f"{MORE_LIKE_THIS_PREFIX}latest.json"


def more_like_this_result_key(request_id: str) -> str:
    return f"{MORE_LIKE_THIS_PREFIX}{request_id}.parquet"
