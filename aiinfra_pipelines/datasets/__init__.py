"""Versioned datasets: train/val splits, the frozen benchmark, the calibration sample, manifests.

Everything here is pure logic over frame tables (one row per frame with ``log_id`` and the
``slice`` tag); the Dagster assets in ``assets.py`` read inputs, call these functions and commit
the results to the lake.
"""
