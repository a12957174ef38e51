"""ComputeDomain (compute-domain.nvidia.com): what the cluster controller, the IMEX daemon, the
node driver and the offline tools share. Pure: no I/O, no NVML, no API client, so every room
may import it (cluster code, node code and ``validate`` alike)."""
