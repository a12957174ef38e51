"""The node process: kubelet registration, the DRA gRPC service, CDI specs and the checkpoint."""
