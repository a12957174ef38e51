"""The node process: kubelet registration, the DRA gRPC service, the per-claim records."""
