"""zfbench."""
