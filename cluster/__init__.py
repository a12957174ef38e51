"""Cluster-scope workloads: code that runs as a workload of its own, not in the node's kubelet
plugin (the ComputeDomain controller and the IMEX daemon it deploys, later admission). It never
imports node code; what it shares with the node drivers lives in ``driver/``."""
