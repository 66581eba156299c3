"""The learner: scores its own rows, gathers every agent's rows, updates, publishes weights."""
