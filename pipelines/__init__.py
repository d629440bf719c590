"""Pipeline definitions and their command line."""
