"""NVML access: the real pynvml module or the simulated one, behind one interface."""
