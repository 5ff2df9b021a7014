"""Where things live in the ``drive-data`` repository — the contract between uploaders and us.

Raw MCAP logs land under ``logs/`` on ``ingest-<batch>`` branches (lakeFS branch names allow no
slash). Raw logs carry PII and are never merged; ``main`` receives only derived, anonymized data.
"""

INGEST_BRANCH_PREFIX = "ingest-"
LOG_PREFIX = "logs/"
LOG_SUFFIX = ".mcap"

# The release layer moves this pointer (on ``main``) when an engine becomes production; every
# consumer of "the deployed engine" (mining, the fleet, shadow mode) reads it.
PRODUCTION_POINTER_KEY = "release/production.json"
# Versioned datasets: one folder per version; ``latest.json`` names the newest.
DATASETS_PREFIX = "datasets/"
