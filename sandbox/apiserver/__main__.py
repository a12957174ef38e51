"""``python -m sandbox.apiserver --port 0 --kubeconfig-out FILE``: serve until interrupted."""

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence

from driver.common import logs
from sandbox.apiserver._server import LocalApiServer


async def _serve(args: argparse.Namespace) -> None:
    server = LocalApiServer(version=args.version)
    await server.start(args.host, args.port)
    if args.kubeconfig_out:
        server.write_kubeconfig(args.kubeconfig_out)
    print(server.url, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sandbox.apiserver",
        description="Run the local Kubernetes API server (tests and the demo). Prints its URL "
        "once it accepts connections.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=0, help="port; 0 picks a free one")
    parser.add_argument(
        "--kubeconfig-out", metavar="FILE", help="write a kubeconfig for this server to FILE"
    )
    parser.add_argument(
        "--version", default="1.34.0", help="Kubernetes version to report on /version"
    )
    parser.add_argument("--log-level", default="WARNING", help="DEBUG, INFO, WARNING or ERROR")
    args = parser.parse_args(argv)
    logs.setup(args.log_level)
    asyncio.run(_serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
