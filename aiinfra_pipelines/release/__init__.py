"""Release: certification, MLflow registry lineage, shadow mode, staged rollout, TUF OTA, trace.

Everything here acts only on certified candidates: ``certified_engine`` re-verifies every gate
from the published reports and signs a certificate; every later step (shadow, rollout, OTA)
verifies that signature before it acts, so a report changed after the fact stops the release.
"""
