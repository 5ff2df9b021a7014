"""The data engine's curation layer: naming, finding and choosing the scenes worth learning from.

Everything here reads published lake state (the scene index and the tables beside it) at an
explicit ref, so a slice, a selection or a trigger proposal can always be replayed against the
exact commit it was made from.
"""
