"""Where things live in the ``drive-data`` repository — the contract between uploaders and us.

Raw MCAP logs land under ``logs/`` on ``ingest-<batch>`` branches (lakeFS branch names allow no
slash). Raw logs carry PII and are never merged; ``main`` receives only derived, anonymized data.
"""

INGEST_BRANCH_PREFIX = "ingest-"
LOG_PREFIX = "logs/"
LOG_SUFFIX = ".mcap"
