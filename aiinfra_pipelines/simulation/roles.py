"""The four planners every regression report drives, by role.

The candidate and production are compared by the gate; the oracle (ground-truth perception:
the ceiling this planner reaches with perfect perception) and model zero (the bootstrap engine
the loop started from: the floor) are driven on the same scenarios and seeds and reported
beside them, never gated. A module of its own so the gate and the report need no simulator.
"""

ROLE_CANDIDATE = "candidate"
ROLE_PRODUCTION = "production"
ROLE_ORACLE = "oracle"
ROLE_MODEL_ZERO = "model_zero"
# Report order: the two compared, then ceiling and floor.
ROLES = (ROLE_CANDIDATE, ROLE_PRODUCTION, ROLE_ORACLE, ROLE_MODEL_ZERO)
# The engine identity of ground-truth perception (engines are identified by ONNX sha256).
GROUND_TRUTH_IDENTITY = "ground-truth"
