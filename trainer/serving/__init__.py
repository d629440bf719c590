"""Serving: the serving check, TF Serving's REST contract in a process, KServe deployment."""
