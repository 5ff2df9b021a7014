"""How our Dagster runs are labelled, and which of them still count as running.

Sensors tag the runs they request and later look runs up by those tags (to avoid launching a
step twice, to find what a batch started); failure records keep every ``aiinfra/`` tag. A tag
spelled differently in two places silently breaks that lookup, so every name lives here.
"""

import dagster as dg

TAG_PREFIX = "aiinfra/"
SOURCE_COMMIT_TAG = f"{TAG_PREFIX}source_commit"
LOG_COUNT_TAG = f"{TAG_PREFIX}logs"
GROUP_TAG = f"{TAG_PREFIX}group"
# ``gpu`` on runs that need the GPU: the run queue's tag concurrency limits (dagster.yaml) key
# on it, so its spelling must match the deployment's configuration.
RESOURCE_TAG = f"{TAG_PREFIX}resource"
TRIGGER_TAG = f"{TAG_PREFIX}trigger"
MODEL_VERSION_TAG = f"{TAG_PREFIX}model_version"
RELEASE_STEP_TAG = f"{TAG_PREFIX}release_step"
SIMULATION_STAGE_TAG = f"{TAG_PREFIX}simulation_stage"

# A run in one of these states has not finished: a sensor must not launch its twin, and the
# demo must keep waiting for it.
IN_FLIGHT = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]
