"""Storage: locations on paths, S3 and GCS, publishing, KFP's object store, the parameter-server status."""
