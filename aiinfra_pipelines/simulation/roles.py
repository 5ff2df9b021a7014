"""The planners every regression report drives, by role.

The candidate is compared with production (the reference release) and with the version that
fixed a scenario (``fixer``, per scenario, where the library recorded a confirmed fix by a
version other than production); the oracle (ground-truth perception: the ceiling this planner
reaches with perfect perception) and model zero (the bootstrap engine the loop started from:
the floor) are driven on the same scenarios and seeds and reported beside them — the oracle is
also the reference of the first release. A module of its own so the gate and the report need
no simulator.
"""

ROLE_CANDIDATE = "candidate"
ROLE_PRODUCTION = "production"
ROLE_ORACLE = "oracle"
ROLE_MODEL_ZERO = "model_zero"
ROLE_FIXER = "fixer"
# Report order: the two compared, then ceiling and floor. Every scenario drives these four.
ROLES = (ROLE_CANDIDATE, ROLE_PRODUCTION, ROLE_ORACLE, ROLE_MODEL_ZERO)
# The engine identity of ground-truth perception (engines are identified by ONNX sha256).
GROUND_TRUTH_IDENTITY = "ground-truth"
