"""encoder stage."""
