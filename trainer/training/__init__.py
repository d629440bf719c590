"""Training one task: the two strategies' runners, their callbacks, and the training process's entry."""
