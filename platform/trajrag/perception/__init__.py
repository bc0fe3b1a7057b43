"""perception stage."""
