"""Ingestion: drive logs on ingest branches → validated → anonymized → scene index → main."""
