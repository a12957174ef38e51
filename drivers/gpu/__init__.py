"""The gpu.nvidia.com node driver on the shared kubelet-plugin framework."""
