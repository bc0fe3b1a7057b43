"""planners stage."""
