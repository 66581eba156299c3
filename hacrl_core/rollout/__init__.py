"""Rollout: sampling engines behind one interface, and the rollout worker."""
