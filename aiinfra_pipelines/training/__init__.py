"""Perception model training: the Lightning module and datamodule, metrics, and the training
entry point the ``trained_model`` asset calls (``train_perception_model``).

Pure metric functions live in :mod:`.metrics` so offline evaluation reports exactly the numbers
validation does; heavy imports (Lightning, MLflow) stay in the submodules. The entry point
(:mod:`.train`) composes one-job modules: :mod:`.settings` (training.yaml), :mod:`.trainer`
(the Lightning Trainer built from it), :mod:`.checkpointing`, :mod:`.tracking` (MLflow),
:mod:`.evaluation` and :mod:`.warm_start`.
"""
