"""The least a Python plugin on our stack can do per call, as a peer in bench_prepare.

``python -m tests.bench.stackfloor {aio,sync} SOCKET DIR URL`` serves the kubelet's DRA
v1 service on SOCKET, and its registration service (naming SOCKET), so the bench's
kubelet drives it as it drives the plugins it compares. A prepare fetches each claim
(plain GET, JSON), reserves its first device (one symlink) and writes a spec (temp file,
rename) in DIR, as our plugin does without fsync; an unprepare removes both. No
validation, no logs, no metrics, no recovery: what is left is the cost of the stack
itself. ``aio`` is grpc.aio with aiohttp (what the daemon runs on), ``sync`` is grpc's
thread-pool server with http.client. It prints ``ready`` once it serves.
"""

import asyncio
import json
import os
import sys
import threading
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPConnection
from pathlib import Path
from typing import Any

import grpc

from api.gen import dra_v1_pb2 as v1
from api.gen import dra_v1_pb2_grpc as v1_grpc
from api.gen import pluginregistration_v1_pb2 as reg
from api.gen import pluginregistration_v1_pb2_grpc as reg_grpc


def _info(socket: str) -> reg.PluginInfo:
    return reg.PluginInfo(
        type="DRAPlugin",
        name="gpu.nvidia.com",
        endpoint=socket,
        supported_versions=["v1.DRAPlugin"],
    )


class _Files:
    def __init__(self, directory: str) -> None:
        self._dir = Path(directory)

    def prepare(self, claim: v1.Claim, obj: dict[str, Any], response: Any) -> None:
        device = obj["status"]["allocation"]["devices"]["results"][0]["device"]
        (self._dir / device).symlink_to(claim.uid)
        tmp = self._dir / f".{claim.uid}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, json.dumps({"uid": claim.uid, "device": device}).encode())
        finally:
            os.close(fd)
        tmp.rename(self._dir / f"{claim.uid}.json")
        entry = response.claims[claim.uid]
        entry.devices.add(request_names=["gpu"], pool_name="p", device_name=device)

    def unprepare(self, claim: v1.Claim, response: Any) -> None:
        path = self._dir / f"{claim.uid}.json"
        device = json.loads(path.read_bytes())["device"]
        path.unlink()
        (self._dir / device).unlink()
        response.claims[claim.uid].error = ""


def _path(claim: v1.Claim) -> str:
    return f"/apis/resource.k8s.io/v1/namespaces/{claim.namespace}/resourceclaims/{claim.name}"


def _serve_sync(socket: str, files: _Files, url: str) -> None:
    address = urllib.parse.urlsplit(url)
    local = threading.local()

    def get(path: str) -> dict[str, Any]:
        if not hasattr(local, "conn"):  # one kept-alive connection per worker thread
            local.conn = HTTPConnection(address.hostname or "", address.port)
        local.conn.request("GET", path, headers={"Accept": "application/json"})
        found: dict[str, Any] = json.loads(local.conn.getresponse().read())
        return found

    class Servicer(v1_grpc.DRAPluginServicer):
        def NodePrepareResources(self, request: Any, context: Any) -> Any:
            response = v1.NodePrepareResourcesResponse()
            for claim in request.claims:
                files.prepare(claim, get(_path(claim)), response)
            return response

        def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
            response = v1.NodeUnprepareResourcesResponse()
            for claim in request.claims:
                files.unprepare(claim, response)
            return response

    class Registration(reg_grpc.RegistrationServicer):
        def GetInfo(self, request: Any, context: Any) -> Any:
            return _info(socket)

        def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
            return reg.RegistrationStatusResponse()

    server = grpc.server(ThreadPoolExecutor(8))
    v1_grpc.add_DRAPluginServicer_to_server(Servicer(), server)
    reg_grpc.add_RegistrationServicer_to_server(Registration(), server)
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()


async def _serve_aio(socket: str, files: _Files, url: str) -> None:
    import aiohttp

    async with aiohttp.ClientSession(url) as session:

        class Servicer(v1_grpc.DRAPluginServicer):
            async def NodePrepareResources(self, request: Any, context: Any) -> Any:
                response = v1.NodePrepareResourcesResponse()
                for claim in request.claims:
                    headers = {"Accept": "application/json"}
                    async with session.get(_path(claim), headers=headers) as answer:
                        obj = json.loads(await answer.read())
                    files.prepare(claim, obj, response)
                return response

            async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
                response = v1.NodeUnprepareResourcesResponse()
                for claim in request.claims:
                    files.unprepare(claim, response)
                return response

        class Registration(reg_grpc.RegistrationServicer):
            async def GetInfo(self, request: Any, context: Any) -> Any:
                return _info(socket)

            async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
                return reg.RegistrationStatusResponse()

        server = grpc.aio.server()
        v1_grpc.add_DRAPluginServicer_to_server(Servicer(), server)
        reg_grpc.add_RegistrationServicer_to_server(Registration(), server)
        server.add_insecure_port(f"unix://{socket}")
        await server.start()
        print("ready", flush=True)
        await server.wait_for_termination()


def main() -> None:
    flavor, socket, directory, url = sys.argv[1:5]
    if flavor == "sync":
        _serve_sync(socket, _Files(directory), url)
    else:
        asyncio.run(_serve_aio(socket, _Files(directory), url))


if __name__ == "__main__":
    main()
