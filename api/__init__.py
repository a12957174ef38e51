"""Wire definitions: the kubelet's gRPC protocols and our opaque device configuration."""
