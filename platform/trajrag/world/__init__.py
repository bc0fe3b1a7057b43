"""Worlds: scenes, the simulator, ObjectNav episodes and metrics (habitat-lab conventions)."""
