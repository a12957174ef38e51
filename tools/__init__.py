"""The offline tools: pure functions over manifests and slices.

Kubernetes' DRA CEL environment (``cel``), the scheduler's allocator (``allocation``) and
manifest validation (``validation``), behind ``gpu-dra explain`` and ``gpu-dra validate``.
The node daemon never imports them (an import-linter contract).
"""
