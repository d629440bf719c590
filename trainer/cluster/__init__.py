"""A cluster of tasks: TF_CONFIG, the supervisor, its control channel, resuming together, local tasks."""
