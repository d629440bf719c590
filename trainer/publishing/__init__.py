"""Publishing: a model's versions under a root, the latest pointer set by compare-and-set, claims, withdrawals."""
