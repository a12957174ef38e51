"""What a container gets from our claim specs against NVIDIA's own plugin's (issue #40).

``tests/data/nvidia-plugin/containers-<profile>.json`` holds what NVIDIA's GPU kubelet
plugin (v0.4.1, built and run by hand on the simulated node: ``tests/e2e/nvidia_plugin.py``)
answered to ``NodePrepareResources`` and the CDI spec it wrote for each claim of its
``CLAIMS`` (one GPU, four GPUs and a time-sliced GPU on a p5e.48xlarge; one MIG device, two
of one GPU, and a MIG device with a whole GPU on a p4d.24xlarge in static MIG), with the
driver root and the claim's UID normalized. Ours for the same devices is built here as the
claim state builds it: the toolkit's edits from the real ``nvidia-ctk`` over the same kind of
fake driver root (it skips where ``python -m tests.e2e.build nvidia-ctk`` has not run), our
kinds' edits, our spec builder. A time-sliced claim's spec is a plain one's in both drivers
(the time slice is set through nvidia-smi at prepare, a side effect, not an edit), as
NVIDIA's record shows.

Compared is the container's view: the CDI device IDs, and the spec's and its devices' edits
merged (device nodes, environment, mounts, hooks), each keyed by what names it (a node's
path, a variable's name, a mount's container path, a hook's subcommand). Everything differs
only as :data:`DELIBERATE` says.
"""

import asyncio
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import pytest

from driver.devicekind import PreparedClaim, PreparedDevice
from driver.nvml.simulated import HARDWARE_ENV, SimulatedNode
from drivers.gpu.flavor import GPU
from drivers.gpu.kinds import GpuNode, gpu_kinds
from drivers.gpu.kinds.gpu import own_node
from drivers.gpu.model.discovery import discover
from kubeletplugin import cdi
from kubeletplugin.containertoolkit import base_edits, dev_root
from kubeletplugin.devices import devices_of
from tests.simroot import ctk_binary, install_driver_files

RECORDS: Final = Path(__file__).parent / "data" / "nvidia-plugin"
PROFILES: Final = ("p5e.48xlarge", "p4d.24xlarge-mig")
UID: Final = "0b0c1f8e-6a3b-4b8a-9d1e-3f0f5c2d7e11"
ROOT: Final = "<driver-root>"

_TOOLKIT = (
    "the toolkit's edits differ by version: ours are the node's own `nvidia-ctk cdi "
    "generate` (v1.20.2 here, as the EKS AMI installs one), NVIDIA's come from the toolkit "
    "library its plugin vendors (nvidia-container-toolkit v1.19.1 in v0.4.1)"
)
# (part, what names it) -> (whose it is: "ours", "NVIDIA's" or "both, different"), why.
DELIBERATE: Final[dict[tuple[str, str], tuple[str, str]]] = {
    ("env", "GPU_DRA_VISIBLE_GPU_UUIDS"): (
        "ours",
        "the claim's GPU UUIDs for the container's tools (ours: `gpu-dra doctor` and the "
        "simulated NVML read it); NVIDIA_VISIBLE_DEVICES=void is in both",
    ),
    ("env", "GPU_DRA_VISIBLE_MIG_UUIDS"): (
        "ours",
        "the claim's MIG device UUIDs, as GPU_DRA_VISIBLE_GPU_UUIDS for whole GPUs",
    ),
    ("env", "NVIDIA_CTK_LIBCUDA_DIR"): (
        "both, different",
        f"{_TOOLKIT}: v1.20 lists every driver library's directory (GetDriverLibDirectories; "
        "here also /run/gpu-dra-sim, where the fake root's simulated hardware file lies), "
        "v1.19 libcuda's alone",
    ),
    ("mounts", "/var/run/nvidia-container-devices/void"): ("ours", _TOOLKIT),
    ("hooks", "update-application-profile"): ("ours", _TOOLKIT),
    ("deviceNodes", "/dev/nvidia-caps/nvidia-cap<N>"): (
        "both, different",
        "a MIG device's capability nodes (the same two, same minors): ours name them under "
        "the dev root, the driver root's /dev when it has one, as every node of our spec and "
        "NVIDIA's own GPU nodes are; NVIDIA's name no host path, so the runtime takes the "
        "host's /dev. With the driver on the host (EKS: driver root /) both are the host's",
    ),
}
_CAPS = re.compile(r"^/dev/nvidia-caps/nvidia-cap\d+$")
# Differences in how the same view is written, checked separately (test_how_each_is_written).
WRITTEN: Final[dict[str, str]] = {
    "hook binary": (
        "NVIDIA's hooks run the nvidia-cdi-hook its image copies into the plugin's "
        "directory; ours run the node's own nvidia-ctk (`nvidia-ctk hook <name>`), the "
        "toolkit the container runtime already uses: the same hooks, the same arguments"
    ),
    "device node fields": (
        "NVIDIA's nodes carry major, minor, fileMode and permissions; ours name the host "
        "path only, and the runtime reads the rest from the node itself (CDI's rule), so a "
        "node re-created with another major is still right"
    ),
    "spec annotations": (
        "ours is cdiVersion 0.6.0 with annotations: the spec is our durable record of the "
        "claim (its UID, namespace, name, devices, kinds), read back at restart; NVIDIA's is "
        "0.5.0 without them (it keeps a checkpoint file instead)"
    ),
}


def _record(profile: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((RECORDS / f"containers-{profile}.json").read_text())
    assert body["source"]["tag"] == "v0.4.1" and body["source"]["profile"] == profile
    return body


def _claims() -> Iterable[tuple[str, str, dict[str, Any]]]:
    """(profile, claim name, record) of every recorded claim."""
    for profile in PROFILES:
        for name, claim in _record(profile)["claims"].items():
            yield profile, name, claim


def _merged(spec: Mapping[str, Any]) -> dict[str, list[Any]]:
    """The spec's edits and every device's, as one container gets them."""
    out: dict[str, list[Any]] = {"env": [], "deviceNodes": [], "mounts": [], "hooks": []}
    for edits in [spec.get("containerEdits", {})] + [d["containerEdits"] for d in spec["devices"]]:
        for part in out:
            out[part].extend(edits.get(part, []))
    return out


def _hook_command(args: list[str]) -> tuple[str, ...]:
    """A hook's subcommand and arguments, whichever binary runs it."""
    if args[:2] == ["nvidia-ctk", "hook"]:
        return tuple(args[2:])
    assert args[0] == "nvidia-cdi-hook", args
    return tuple(args[1:])


def view(spec: Mapping[str, Any]) -> dict[tuple[str, str], Any]:
    """(part, what names it) -> what the container gets of it."""
    merged = _merged(spec)
    out: dict[tuple[str, str], Any] = {}
    for entry in merged["env"]:
        name, _, value = entry.partition("=")
        out[("env", name)] = value
    for node in merged["deviceNodes"]:
        out[("deviceNodes", node["path"])] = node.get("hostPath", node["path"])
    for mount in merged["mounts"]:
        out[("mounts", mount["containerPath"])] = (mount["hostPath"], mount.get("options", []))
    for hook in merged["hooks"]:
        command = _hook_command(hook["args"])
        out[("hooks", command[0])] = (hook["hookName"], command[1:], hook.get("env", []))
    return out


def _normalized(obj: Any, root: Path) -> Any:
    return json.loads(json.dumps(obj).replace(str(root), ROOT).replace(UID, "<claim-uid>"))


def _specs(profile: str, root: Path, ctk: Path) -> dict[str, dict[str, Any]]:
    """Our spec and CDI device IDs for each recorded claim of ``profile``."""
    node_name = f"sim-{profile}"
    node = SimulatedNode(profile, node_name, root)
    inventory = discover(node.nvml, sysfs_root=node.sysfs_root)
    # The toolkit's node-wide edits (libraries, binaries, control nodes; its GPU nodes are
    # dropped, ours named instead) come from the same instance type with MIG off: `nvidia-ctk
    # cdi generate` reads MIG capabilities from the host's /proc, which a fake root cannot
    # hold (NVIDIA's plugin was given the simulated one in a mount namespace of its own).
    toolkit_root = root.with_name("toolkit-root")
    toolkit_node = SimulatedNode(profile.removesuffix("-mig"), node_name, toolkit_root)
    install_driver_files(toolkit_root, toolkit_node.profile.driver_version, ctk)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(HARDWARE_ENV, str(toolkit_node.nvml.render()))
        base = asyncio.run(
            base_edits("system", container_root=toolkit_root, host_root=root, own_node=own_node)
        )
    kinds = tuple(gpu_kinds(GpuNode()).values())
    devices = {d.name: d for d in devices_of(kinds, inventory, node_name=node_name)}
    specs = {}
    for name, claim in _record(profile)["claims"].items():
        prepared = PreparedClaim(
            uid=UID,
            namespace="default",
            name=name,
            devices=tuple(
                PreparedDevice(
                    request_names=("gpu",),
                    pool_name=node_name,
                    device_name=d,
                    cdi_device_ids=(cdi.cdi_device_id(UID, d, None, GPU),),
                    admin_access=False,
                    kind=devices[d].kind,
                    identity=tuple(devices[d].identity.items()),
                )
                for d in claim["devices"]
            ),
        )
        edits = {
            kind: GPU.kinds[kind].claim_edits(of_kind, prepared)
            for kind, of_kind in cdi.kinds_of(prepared, devices).items()
        }
        spec = cdi.build_claim_spec(
            prepared, devices, base, edits, flavor=GPU, dev_root=dev_root(root, root)
        )
        ids = [i for d in prepared.devices for i in d.cdi_device_ids]
        specs[name] = {"spec": _normalized(spec, root), "ids": _normalized(ids, root)}
    return specs


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], dict[str, Any]]:
    """Our spec for each recorded claim, on the profile's fake root with the real toolkit."""
    ctk = ctk_binary()
    if ctk is None:
        pytest.skip("nvidia-ctk is not built: run python -m tests.e2e.build nvidia-ctk")
    out = {}
    for profile in PROFILES:
        root = tmp_path_factory.mktemp("cv") / "root"
        for name, spec in _specs(profile, root, ctk).items():
            out[(profile, name)] = spec
    return out


def _theirs(claim: Mapping[str, Any]) -> dict[str, Any]:
    (spec,) = claim["specs"].values()  # one spec file per claim, as ours
    result: dict[str, Any] = spec
    return result


def _ids(claim: Mapping[str, Any]) -> list[str]:
    (answer,) = claim["prepare"]["claims"].values()
    return [i for d in answer["devices"] for i in d["cdiDeviceIds"]]


def _family(key: tuple[str, str]) -> tuple[str, str]:
    """The DELIBERATE key of ``key``: a MIG capability node's minor is the instance's."""
    part, name = key
    return (part, "/dev/nvidia-caps/nvidia-cap<N>") if _CAPS.match(name) else key


def _differing(
    mine: Mapping[tuple[str, str], Any], theirs: Mapping[tuple[str, str], Any]
) -> Iterable[tuple[tuple[str, str], str]]:
    for key in sorted(mine.keys() | theirs.keys()):
        if key not in theirs:
            yield _family(key), "ours"
        elif key not in mine:
            yield _family(key), "NVIDIA's"
        elif mine[key] != theirs[key]:
            yield _family(key), "both, different"


def test_the_record_is_what_nvidias_plugin_prepared() -> None:
    names = {name for _, name, _ in _claims()}
    assert names == {"one-gpu", "four-gpus", "time-slicing", "one-mig", "two-migs-one-gpu",
                     "mig-and-gpu"}  # fmt: skip
    for _, name, claim in _claims():
        # in any order: NVIDIA's plugin answers a claim's devices in Go map order
        answered = sorted(
            d.removeprefix("k8s.gpu.nvidia.com/claim=<claim-uid>-") for d in _ids(claim)
        )
        assert answered == sorted(claim["devices"]), name
        assert claim["left"] == [], name  # its spec is gone after unprepare
        gpus = {n["path"] for n in _merged(_theirs(claim))["deviceNodes"]}
        # one /dev/nvidiaN per full GPU or MIG parent; two capability nodes per MIG device
        parents = {d.split("-mig-")[0].replace("gpu-", "/dev/nvidia") for d in claim["devices"]}
        migs = [d for d in claim["devices"] if "-mig-" in d]
        assert parents <= gpus, name
        assert len([p for p in gpus if p.startswith("/dev/nvidia-caps/")]) == 2 * len(migs), name


def test_same_cdi_device_ids(ours: dict[tuple[str, str], dict[str, Any]]) -> None:
    for profile, name, claim in _claims():
        assert sorted(ours[(profile, name)]["ids"]) == sorted(_ids(claim)), name


def test_the_container_view_differs_only_as_listed(
    ours: dict[tuple[str, str], dict[str, Any]],
) -> None:
    seen: dict[tuple[str, str], str] = {}
    for profile, name, claim in _claims():
        mine, theirs = view(ours[(profile, name)]["spec"]), view(_theirs(claim))
        # GPUs, control nodes, libraries, binaries, firmware: the container's essentials.
        assert [k for k in theirs if k[0] == "deviceNodes"], name
        for key, whose in _differing(mine, theirs):
            assert key in DELIBERATE, (name, key, whose, mine.get(key), theirs.get(key))
            assert DELIBERATE[key][0] == whose, (name, key, whose)
            seen[key] = whose
    assert set(seen) == set(DELIBERATE), seen  # no stale entry


def test_how_each_is_written(ours: dict[tuple[str, str], dict[str, Any]]) -> None:
    """The differences of WRITTEN, each as it says."""
    assert set(WRITTEN) == {"hook binary", "device node fields", "spec annotations"}
    for profile, name, claim in _claims():
        mine, theirs = ours[(profile, name)]["spec"], _theirs(claim)
        hooks = {h["path"] for h in _merged(mine)["hooks"]}
        assert hooks == {f"{ROOT}/usr/bin/nvidia-ctk"}
        assert {h["path"] for h in _merged(theirs)["hooks"]} == {f"{ROOT}/usr/bin/nvidia-cdi-hook"}
        assert all(set(n) == {"path", "hostPath"} for n in _merged(mine)["deviceNodes"])
        assert all("major" in n and "fileMode" in n for n in _merged(theirs)["deviceNodes"])
        assert (mine["cdiVersion"], theirs["cdiVersion"]) == ("0.6.0", "0.5.0")
        assert "annotations" in mine and "annotations" not in theirs
        assert mine["kind"] == theirs["kind"] == "k8s.gpu.nvidia.com/claim"
