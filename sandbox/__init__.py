"""The sandbox: what lets a person or a test run the whole DRA flow on one machine.

The local API server (``sandbox.apiserver``), the kubelet simulator (``sandbox.kubeletsim``)
and the demo (``sandbox.demo``). Nothing of the product imports it but the ``gpu-dra demo``
subcommand (an import-linter contract).
"""
