"""Whole-cluster deterministic simulation of the production node (tests/sim/world.py)."""
