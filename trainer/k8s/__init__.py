"""Kubernetes: a run's Services and labels, joining the cluster by name, claims (the only users of the client)."""
