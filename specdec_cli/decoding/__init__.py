"""The draft-then-verify loop and its pure parts: the engine, what a drafter proposes and is told (draft.py),
the generation settings, acceptance rules, sampling, the cost-aware planner, the verify-cost curve and where it is
kept, and the statistics of a generation.

It drives a target (target_model/) through the drafter protocol; no drafter is named here.
"""
