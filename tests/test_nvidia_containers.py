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

An MPS claim (``containers-p5e.48xlarge-mps.json``: NVIDIA's prepare waits for its control
daemon's Deployment, which the recorder reported ready in place of a kubelet) is compared
the same way, built here with our GPU kind attached under a plugins directory: it differs
as DELIBERATE and :data:`MPS_DELIBERATE` say (where each mounts the daemon's pipe, NVIDIA's
shared ``/dev/shm``, where the limits are set).
"""

import asyncio
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import pytest

from api.config import decode_gpu_config
from driver.common.quantity import Quantity
from driver.devicekind import PreparedClaim, PreparedDevice
from driver.nvml.simulated import HARDWARE_ENV, SimulatedNode
from drivers.gpu.flavor import GPU
from drivers.gpu.kinds import GpuKindContext, GpuNode, gpu_kinds
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
PLUGINS: Final = "<plugins>"
DRIVER: Final = "gpu.nvidia.com"

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


def _record(name: str) -> dict[str, Any]:
    """``containers-<name>.json``: a profile's, or ``<profile>-mps``."""
    body: dict[str, Any] = json.loads((RECORDS / f"containers-{name}.json").read_text())
    source = body["source"]
    assert source["tag"] == "v0.4.1" and source["profile"] == name.removesuffix("-mps")
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
    text = json.dumps(obj).replace(str(_plugins(root)), PLUGINS).replace(str(root), ROOT)
    return json.loads(text.replace(UID, "<claim-uid>"))


def _plugins(root: Path) -> Path:
    """The kubelet's plugins directory beside a fake driver root."""
    return root.with_name("plugins")


def _sharing(config: list[dict[str, Any]]) -> tuple[tuple[str, str], ...]:
    """What our claim state records of a recorded claim's sharing config (NVIDIA's GpuConfig,
    which ours takes as it is)."""
    if not config:
        return ()
    (entry,) = config
    return decode_gpu_config(entry["opaque"]["parameters"], source="test").sharing_settings()


def _specs(profile: str, root: Path, ctk: Path, record: str = "") -> dict[str, dict[str, Any]]:
    """Our spec and CDI device IDs for each claim of ``containers-<record>.json`` (the
    profile's own when ""), on ``profile``."""
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
    table = gpu_kinds(GpuNode())
    # Attached as the claim state attaches it: MPS's edits name the pipe under the plugin's
    # directory, <plugins>/<driver>.
    state = _plugins(root) / DRIVER / "kinds" / "gpu"
    table["gpu"].attach(GpuKindContext(state, "", GpuNode()))
    kinds = tuple(table.values())
    devices = {d.name: d for d in devices_of(kinds, inventory, node_name=node_name)}
    specs = {}
    for name, claim in _record(record or profile)["claims"].items():
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
                    sharing=_sharing(claim["config"]),
                )
                for d in claim["devices"]
            ),
        )
        edits = {
            kind: table[kind].claim_edits(of_kind, prepared)
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


# MPS: ``containers-p5e.48xlarge-mps.json``, NVIDIA's plugin with its MPSSupport gate
# preparing one H200 with its example's mpsConfig (50 % of the threads, 10Gi pinned), its
# control daemon's Deployment reported ready by the recorder (no kubelet ran it).
MPS_PROFILE: Final = "p5e.48xlarge"
_PIPE_KEY = re.compile(r"^<plugins>/gpu\.nvidia\.com/mps/[0-9a-f]{12}$")
_OUR_PIPE: Final = ("mounts", "<plugins>/gpu.nvidia.com/mps/<gpu key>")
# What differs for an MPS claim beside DELIBERATE: (part, what names it) -> (whose, why).
MPS_DELIBERATE: Final[dict[tuple[str, str], tuple[str, str]]] = {
    ("env", "CUDA_MPS_PIPE_DIRECTORY"): (
        "both, different",
        "each names the pipe directory it mounts, where the claim's daemon binds its sockets: "
        "NVIDIA's at /tmp/nvidia-mps (MPS's default path) from <plugins>/<driver>/mps/<claim "
        "uid>-<hash>/pipe, one daemon per claim; ours at the host's own path, "
        "<plugins>/<driver>/mps/<sha256 of the GPU UUID, 12 hex>, one daemon per GPU shared by "
        "its claims, the same path in the daemon and every client, short enough for the "
        "daemon's socket paths (docs/CONTRIBUTING.md, MPS)",
    ),
    ("mounts", "/tmp/nvidia-mps"): ("NVIDIA's", "its pipe directory, as above"),
    _OUR_PIPE: ("ours", "our pipe directory, as above"),
    ("mounts", "/dev/shm"): (
        "NVIDIA's",
        "a tmpfs per daemon (<plugins>/<driver>/mps/<id>/shm, mounted by the plugin) at "
        "/dev/shm in the daemon's pod and every client container, so they share one /dev/shm; "
        "ours mounts none: a client keeps its container's own /dev/shm. Whether a CUDA MPS "
        "client in a container needs the daemon's /dev/shm is not checked here (it needs a GPU "
        "and containers: our real-GPU check runs its clients on the host)",
    ),
    ("env", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"): (
        "ours",
        "the config's defaultActiveThreadPercentage as the client's limit; NVIDIA's gives it to "
        "its claim's own daemon instead (set_default_active_thread_percentage 50): the same "
        "limit for the claim's clients, set on the client in ours since our daemon serves "
        "every claim of the GPU",
    ),
    ("env", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"): (
        "ours",
        "the config's defaultPinnedDeviceMemoryLimit as the client's limit for its device 0, "
        "in whole MiB (0=10240M); NVIDIA's gives its daemon the same MiB "
        "(set_default_device_pinned_mem_limit <uuid> 10240M)",
    ),
}


def _mps_family(key: tuple[str, str]) -> tuple[str, str]:
    return _OUR_PIPE if key[0] == "mounts" and _PIPE_KEY.match(key[1]) else _family(key)


@pytest.fixture(scope="module")
def mps(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any]]:
    """(our spec and IDs, NVIDIA's record) for the recorded MPS claim."""
    ctk = ctk_binary()
    if ctk is None:
        pytest.skip("nvidia-ctk is not built: run python -m tests.e2e.build nvidia-ctk")
    root = tmp_path_factory.mktemp("mps") / "root"
    record = _record(f"{MPS_PROFILE}-mps")
    assert record["source"]["featureGates"] == "MPSSupport=true"
    (name,) = record["claims"]
    return _specs(MPS_PROFILE, root, ctk, f"{MPS_PROFILE}-mps")[name], record["claims"][name]


def test_mps_record_is_what_nvidias_plugin_prepared(
    mps: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    _, claim = mps
    assert claim["devices"] == ["gpu-6"] and claim["left"] == []
    ((daemon,),) = [claim["daemons"]]  # its claim's own control daemon
    assert daemon["readyReplicas"] == 1  # the recorder's stand-in kubelet
    assert daemon["name"].startswith("mps-control-daemon-<claim-uid>-")
    pod = daemon["pod"]
    assert pod["nodeName"] == f"sim-{MPS_PROFILE}" and pod["hostPID"] is True
    volumes = {v["name"]: v["hostPath"]["path"] for v in pod["volumes"]}
    theirs = view(_theirs(claim))
    # The client's pipe and shm are the daemon's: the same host directories.
    assert theirs[("mounts", "/tmp/nvidia-mps")][0] == volumes["mps-pipe-directory"]
    assert theirs[("mounts", "/dev/shm")][0] == volumes["mps-shm-directory"]
    assert volumes["mps-log-directory"] not in {v[0] for k, v in theirs.items() if k[0] == "mounts"}
    (uuid,) = [
        e["value"] for e in pod["containers"][0]["env"] if e["name"] == "CUDA_VISIBLE_DEVICES"
    ]
    assert daemon["controlCommands"] == [
        "set_default_active_thread_percentage 50",
        f"set_default_device_pinned_mem_limit {uuid} 10240M",
    ]


def test_mps_container_view_differs_only_as_listed(
    mps: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    ours, claim = mps
    assert sorted(ours["ids"]) == sorted(_ids(claim))
    mine, theirs = view(ours["spec"]), view(_theirs(claim))
    seen: dict[tuple[str, str], str] = {}
    for key, whose in _differing(mine, theirs):
        key = _mps_family(key)
        expected = MPS_DELIBERATE.get(key) or DELIBERATE.get(key)
        assert expected is not None, (key, whose, mine.get(key), theirs.get(key))
        assert expected[0] == whose, (key, whose)
        seen[key] = whose
    assert set(MPS_DELIBERATE) <= set(seen), seen  # no stale entry
    # Each names the directory it mounts; ours at the host's own path.
    (pipe,) = [k[1] for k in mine if _mps_family(k) == _OUR_PIPE]
    assert mine[("env", "CUDA_MPS_PIPE_DIRECTORY")] == pipe and mine[("mounts", pipe)][0] == pipe
    assert theirs[("env", "CUDA_MPS_PIPE_DIRECTORY")] == "/tmp/nvidia-mps"
    # The same limits, on the client (ours) or the daemon (NVIDIA's), in the same MiB.
    assert mine[("env", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")] == "50"
    assert mine[("env", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")] == "0=10240M"
    assert Quantity.parse("10Gi").value == 10240 << 20
    # The GPU itself reaches the container alike: its device node, from the same host path.
    assert mine[("deviceNodes", "/dev/nvidia6")] == theirs[("deviceNodes", "/dev/nvidia6")]
