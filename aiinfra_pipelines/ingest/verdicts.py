"""What ingest can say about one uploaded object (a column of ``validated_drive_logs``)."""

from __future__ import annotations

ACCEPTED, QUARANTINED, DUPLICATE, ALREADY_INGESTED = (
    "accepted",
    "quarantined",
    "duplicate",
    "already_ingested",
)
# A car's answer to a pull it cannot serve (not a log: it closes a request, nothing else).
NOTICE = "notice"
# Verdicts that change main when published (a batch of only repeats publishes nothing new).
JUDGED = (ACCEPTED, QUARANTINED, NOTICE)
