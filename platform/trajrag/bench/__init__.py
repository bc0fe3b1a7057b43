"""bench stage."""
