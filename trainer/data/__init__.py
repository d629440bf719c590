"""Data: sources into TFRecord shards (the prepared-dataset format) and the input pipelines that read them."""
