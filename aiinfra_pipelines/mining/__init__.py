"""Badcase mining and label QC: pure logic the ``mining`` assets call.

``engine_runner`` runs the deployed engine over indexed frames in memory-bounded chunks,
``rules`` selects hard frames and says why, ``label_qc`` checks the teacher auto-labels against
an independent labeller, and ``incremental`` keeps the cost proportional to new frames. Nothing
here imports Dagster, so every rule is testable on hand-built arrays.
"""
