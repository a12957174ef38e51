"""GPU discovery, the ResourceSlice model and controller, Kubernetes CEL and the allocator."""

DEFAULT_DRIVER_NAME = "gpu.nvidia.com"
