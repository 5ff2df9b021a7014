"""aiinfra_pipelines."""
