"""A local Kubernetes API server for tests and the demo; never imported by the node daemon."""
