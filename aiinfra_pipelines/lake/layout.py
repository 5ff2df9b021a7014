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
