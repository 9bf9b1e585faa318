"""schedulers."""
