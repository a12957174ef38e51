"""The local API server's cost per ResourceSlice create, and watch fan-out across a fleet.

(a) Median latency of creating an 8-GPU ResourceSlice (15 attributes per device) through
the real ``kubernetes.aio`` client, against a floor measured in the same run: a GET of an
existing object through the same client (HTTP, routing and JSON with no validation, no
indexes, no fan-out). Also the server-side cost alone (store.create without HTTP: schema,
limits, quantities) and the schema check alone.

(b) A fleet of N nodes against one server: each node opens a watch with
``fieldSelector=spec.nodeName=<node>``, lists, then creates its slice. Reported: wall time
and whether every watcher saw exactly its own one event (fan-out filtered per watcher).
"""

import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aiohttp
from kubernetes.aio import client

from driver.kube.session import Session
from sandbox.apiserver import LocalApiServer
from sandbox.apiserver import _validation as validation
from sandbox.apiserver._resources import BY_PATH

RUNS = 200
NODES = 1000
SLICES = BY_PATH[("resource.k8s.io", "v1", "resourceslices")]


def slice_body(node: str) -> dict[str, Any]:
    devices = []
    for i in range(8):
        attributes: dict[str, Any] = {
            "index": {"int": i},
            "minor": {"int": i},
            "uuid": {"string": f"GPU-{node}-{i:04d}-0000-0000-000000000000"},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Hopper"},
            "cudaComputeCapability": {"version": "9.0.0"},
            "driverVersion": {"version": "570.133.20"},
            "cudaDriverVersion": {"version": "12.8.0"},
            "pcieBusID": {"string": f"0000:{16 * i:02x}:00.0"},
            "numaNode": {"int": i // 4},
            "nvlinkDomain": {"string": "nvswitch-0"},
            "migCapable": {"bool": True},
            "type": {"string": "gpu"},
            "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{16 * i:02x}"},
        }
        devices.append(
            {
                "name": f"gpu-{i}",
                "attributes": attributes,
                "capacity": {"memory": {"value": "85520809984"}},
            }
        )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"generateName": f"{node}-gpu.nvidia.com-"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


async def _median_ms(fn: Any, runs: int) -> float:
    samples = []
    for i in range(runs):
        start = time.perf_counter()
        await fn(i)
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples)


async def per_create(server: LocalApiServer) -> None:
    async with Session(client.Configuration(host=server.url)) as api_client:
        api = client.ResourceV1Api(api_client)
        warm = {**slice_body("warm"), "metadata": {"name": "warm"}}
        await api.create_resource_slice(client.V1ResourceSlice.model_validate(warm))

        async def create(i: int) -> None:
            await api.create_resource_slice(
                client.V1ResourceSlice.model_validate(slice_body(f"c{i}"))
            )

        async def get(_: int) -> None:
            await api.read_resource_slice("warm")

        create_ms = await _median_ms(create, RUNS)
        floor_ms = await _median_ms(get, RUNS)
    body = slice_body("direct")
    store_samples, schema_samples = [], []
    for i in range(RUNS):
        start = time.perf_counter()
        server.store.create(SLICES, None, {**body, "metadata": {"name": f"direct-{i}"}})
        store_samples.append((time.perf_counter() - start) * 1000)
        start = time.perf_counter()
        validation.schema_errors(SLICES, body)
        schema_samples.append((time.perf_counter() - start) * 1000)
    store_ms, schema_ms = statistics.median(store_samples), statistics.median(schema_samples)
    print(f"(a) create 8-GPU slice via kubernetes.aio  median {create_ms:7.2f} ms ({RUNS} runs)")
    print(f"    floor: GET of one slice, same client   median {floor_ms:7.2f} ms")
    print(f"    server-side create (no HTTP)           median {store_ms:7.2f} ms")
    print(f"      of which the official schema check   median {schema_ms:7.2f} ms")
    print(f"    ratio create / floor: {create_ms / floor_ms:.2f}x")


async def fleet(server: LocalApiServer) -> None:
    base = f"{server.url}/apis/resource.k8s.io/v1/resourceslices"
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        streams = []
        start = time.perf_counter()
        for i in range(NODES):
            response = await http.get(
                base,
                params={
                    "watch": "true",
                    "fieldSelector": f"spec.nodeName=fleet-{i}",
                    "resourceVersion": str(server.store.rv),
                    "timeoutSeconds": "120",
                },
            )
            streams.append(response)
        opened = time.perf_counter() - start

        async def publish(i: int) -> None:
            listed = await http.get(base, params={"fieldSelector": f"spec.nodeName=fleet-{i}"})
            assert (await listed.json())["items"] == []
            created = await http.post(base, json=slice_body(f"fleet-{i}"))
            assert created.status == 201, await created.text()

        start = time.perf_counter()
        await asyncio.gather(*(publish(i) for i in range(NODES)))
        published = time.perf_counter() - start
        lines = await asyncio.gather(*(asyncio.wait_for(r.content.readline(), 30) for r in streams))
        own = sum(1 for i, line in enumerate(lines) if f'"nodeName":"fleet-{i}"'.encode() in line)
        for r in streams:
            r.close()
    print(
        f"(b) {NODES} node watches opened in {opened:.2f} s; list + create for every node "
        f"in {published:.2f} s ({published / NODES * 1000:.2f} ms per node)"
    )
    print(f"    watchers whose first event was their own node's slice: {own}/{NODES}")


async def main() -> None:
    server = LocalApiServer()
    await server.start()
    try:
        await per_create(server)
        await fleet(server)
    finally:
        await server.stop()


if __name__ == "__main__":
    asyncio.run(main())
