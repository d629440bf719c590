"""Storage: locations on paths, S3 and GCS, with faults named by kind; KFP's object store."""
