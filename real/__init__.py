"""real."""
