"""``gpu-dra demo``: the whole DRA flow on one machine, with no cluster and no GPU.

A local API server (in this process), one real ``gpu-dra kubelet-plugin``
subprocess per simulated node (simulated NVML, real unix sockets in a temporary
directory), the chart's DeviceClasses and a few examples; then the control plane
(claims from templates, allocation with the allocator behind ``gpu-dra explain``,
``status.allocation`` and ``reservedFor`` written as the scheduler writes them)
and the kubelet (registration, NodePrepareResources, the CDI edits a container
gets, NodeUnprepareResources). Nothing in the driver is replaced. Whatever ends
the demo (its end, an error, SIGINT, SIGTERM), the plugins are stopped and the
temporary directory is removed.
"""

import asyncio
import signal
import sys
from typing import TextIO

from sandbox.demo._flow import Demo, Options
from sandbox.demo._nodes import DemoError, NodeSpec, parse_nodes

__all__ = ["DemoError", "NodeSpec", "Options", "main", "parse_nodes"]


def main(options: Options, out: TextIO = sys.stdout) -> int:
    """Run the demo; the exit code. After SIGINT's cleanup, KeyboardInterrupt propagates."""
    try:
        return asyncio.run(Demo(options, out).run())
    except asyncio.CancelledError:
        # Only the demo's SIGTERM handler cancels it from outside; cleanup has run.
        return 128 + signal.SIGTERM
