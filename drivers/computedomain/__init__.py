"""The ComputeDomain node driver, compute-domain.nvidia.com (a sibling of the GPU driver)."""
