"""The records that cross steps, each read and written in one place.

A job's record, the model's history and the prepared dataset's metadata.
"""
