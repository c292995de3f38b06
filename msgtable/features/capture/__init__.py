"""features/capture."""
