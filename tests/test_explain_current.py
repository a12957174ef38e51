"""``gpu-dra explain --cluster`` on a claim that is allocated: which GPU it got, from its
``status.allocation`` and the plugin's ``status.devices`` entry (data, Ready)."""

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli import main
from sandbox.apiserver import LocalApiServer
from tests.test_explain_cli import DRIVER, GPU_CLASS, discover_yaml, write
from tools.allocation.current import current_allocation

CLAIM: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaim",
    "metadata": {"name": "trainer", "namespace": "default"},
    "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
}
UUID = "GPU-11111111-2222-3333-4444-555555555555"


def _status(devices: list[str], *, entries: bool, ready: str = "True") -> dict[str, Any]:
    """What the scheduler writes (allocation, reservedFor) and, once the node prepared the
    devices, the plugin (an entry per device)."""
    status: dict[str, Any] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": DRIVER, "pool": "p5-a", "device": d}
                    for d in devices
                ]
            },
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "In", "values": ["p5-a"]}
                        ]
                    }
                ]
            },
        },
        "reservedFor": [{"resource": "pods", "name": "trainer-0", "uid": "u-1"}],
    }
    if entries:
        message = "prepared on the node" if ready == "True" else "XID 79 on GPU 3"
        status["devices"] = [
            {
                "driver": DRIVER,
                "pool": "p5-a",
                "device": d,
                "data": {"kind": "gpu", "attributes": {"uuid": UUID, "productName": "H100"}},
                "conditions": [
                    {
                        "type": "Ready",
                        "status": ready,
                        "reason": "Prepared" if ready == "True" else "Unhealthy",
                        "message": message,
                        "lastTransitionTime": "2026-12-05T00:00:00Z",
                    }
                ],
            }
            for d in devices
        ]
    return status


def test_the_current_allocation_pairs_results_with_their_status_entries() -> None:
    current = current_allocation({**CLAIM, "status": _status(["gpu-3"], entries=True)})
    assert current is not None
    assert current.node == "p5-a" and current.reserved_for == ("pods/trainer-0",)
    (held,) = current.devices
    assert (held.request, held.pool, held.device) == ("gpu", "p5-a", "gpu-3")
    assert held.attributes["uuid"] == UUID
    assert held.ready is not None and held.ready["status"] == "True"
    # Before the node prepared it: the device, and no status yet.
    early = current_allocation({**CLAIM, "status": _status(["gpu-3"], entries=False)})
    assert early is not None
    assert early.devices[0].data is None and early.devices[0].ready is None
    assert current_allocation(CLAIM) is None


async def _seed(
    api_client: Any, capsys: pytest.CaptureFixture[str], status: dict[str, Any]
) -> None:
    from kubernetes.aio import client

    resource: Any = client.ResourceV1Api(api_client)
    for obj in yaml.safe_load_all(discover_yaml("p5.48xlarge", "p5-a", capsys)):
        await resource.create_resource_slice(obj)
    await resource.create_device_class(GPU_CLASS)
    created = await resource.create_namespaced_resource_claim("default", CLAIM)
    meta = {**CLAIM["metadata"], "resourceVersion": created.metadata.resource_version}
    body = {**CLAIM, "metadata": meta, "status": status}
    await resource.replace_namespaced_resource_claim_status("trainer", "default", body)


@pytest.mark.parametrize("ready", ["True", "False"])
async def test_cluster_shows_which_gpu_the_claim_got_and_whether_it_is_ready(
    apiserver: LocalApiServer,
    api_client: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    ready: str,
) -> None:
    await _seed(api_client, capsys, _status(["gpu-3"], entries=True, ready=ready))
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    claim = write(tmp_path / "claim.yaml", CLAIM)
    argv = ["explain", "-f", str(claim), "--cluster", "--kubeconfig", str(kubeconfig)]
    capsys.readouterr()
    assert await asyncio.to_thread(main, [*argv, "-o", "json"]) == 0
    body = json.loads(capsys.readouterr().out)
    (held,) = body["allocated"]["devices"]
    assert body["allocated"]["node"] == "p5-a"
    assert (held["device"], held["data"]["attributes"]["uuid"]) == ("gpu-3", UUID)
    assert held["ready"]["status"] == ready
    assert await asyncio.to_thread(main, argv) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[1] == "allocated on p5-a, reserved for pods/trainer-0:"
    assert table[4] == "if it were allocated now:"
    row = table[3].split()
    assert row[:5] == ["gpu", "gpu-3", UUID, "H100", ready]
    if ready == "False":
        assert table[3].endswith("(Unhealthy): XID 79 on GPU 3")


async def test_cluster_says_when_the_node_has_not_written_the_status_yet(
    apiserver: LocalApiServer,
    api_client: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await _seed(api_client, capsys, _status(["gpu-3"], entries=False))
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    claim = write(tmp_path / "claim.yaml", CLAIM)
    argv = ["explain", "-f", str(claim), "--cluster", "--kubeconfig", str(kubeconfig)]
    capsys.readouterr()
    assert await asyncio.to_thread(main, argv) == 0
    row = capsys.readouterr().out.splitlines()[3]
    assert row.split()[:4] == ["gpu", "gpu-3", "-", "-"]
    assert row.endswith("- (no status from the node yet)")


def test_offline_the_claim_files_own_status_is_shown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kubectl get resourceclaim -o yaml` saved: its allocation is read from the file."""
    slices = tmp_path / "slices.yaml"
    slices.write_text(discover_yaml("p5.48xlarge", "p5-a", capsys))
    claim = write(tmp_path / "claim.yaml", {**CLAIM, "status": _status(["gpu-3"], entries=True)})
    capsys.readouterr()
    assert main(["explain", "-f", str(claim), "--slices", str(slices), "-o", "json"]) == 0
    (held,) = json.loads(capsys.readouterr().out)["allocated"]["devices"]
    assert (held["device"], held["data"]["attributes"]["uuid"]) == ("gpu-3", UUID)
    plain = write(tmp_path / "plain.yaml", CLAIM)
    assert main(["explain", "-f", str(plain), "--slices", str(slices), "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["allocated"] is None
