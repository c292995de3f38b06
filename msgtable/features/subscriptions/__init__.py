"""features/subscriptions."""
