"""``gpu-dra explain`` end to end: files in, table or JSON out, exit status; and --cluster."""

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli import main
from sandbox.apiserver import LocalApiServer

DRIVER = "gpu.nvidia.com"
GPU_CLASS: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "gpu.nvidia.com"},
    "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.nvidia.com"'}}]},
}
H100_CLASS: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "h100"},
    "spec": {
        "selectors": [
            {
                "cel": {
                    "expression": 'device.attributes["gpu.nvidia.com"].productName'
                    '.startsWith("NVIDIA H100")'
                }
            }
        ]
    },
}
TP4: dict[str, Any] = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaimTemplate",
    "metadata": {"name": "tp4", "namespace": "ml"},
    "spec": {
        "spec": {
            "devices": {
                "requests": [{"name": "gpus", "exactly": {"deviceClassName": DRIVER, "count": 4}}],
                "constraints": [
                    {"requests": ["gpus"], "matchAttribute": "gpu.nvidia.com/nvlinkDomain"}
                ],
            }
        }
    },
}


def discover_yaml(profile: str, node: str, capsys: pytest.CaptureFixture[str]) -> str:
    """What `gpu-dra discover -o yaml` prints for one simulated node."""
    capsys.readouterr()
    code = main(
        ["discover", "--nvml", "simulated", "--profile", profile, "--node-name", node, "-o", "yaml"]
    )
    assert code == 0
    return capsys.readouterr().out


def write(path: Path, *objs: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump_all(objs, sort_keys=False))
    return path


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(["explain", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Path]:
    # Two discover outputs pasted together without "---": what a user gets from `cat`.
    slices = tmp_path / "slices.yaml"
    slices.write_text(
        discover_yaml("p5.48xlarge", "p5-a", capsys)
        + discover_yaml("g6e.48xlarge", "g6e-a", capsys)
    )
    return {
        "slices": slices,
        "classes": write(tmp_path / "classes.yaml", GPU_CLASS, H100_CLASS),
        "claim": write(tmp_path / "claim.yaml", TP4),
    }


def test_table_shows_devices_and_grouped_reasons(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(
        [
            "-f",
            str(files["claim"]),
            "--slices",
            str(files["slices"]),
            "--deviceclass",
            str(files["classes"]),
        ],
        capsys,
    )
    assert code == 0
    assert "ResourceClaimTemplate ml/tp4: allocatable on 1 of 2 node(s)" in out
    rows = {
        line.split()[0]: line for line in out.splitlines() if line.startswith(("p5-a", "g6e-a"))
    }
    assert "yes" in rows["p5-a"] and "gpus: gpu-0, gpu-1, gpu-2, gpu-3" in rows["p5-a"]
    assert rows["g6e-a"].split()[1] == "no"
    assert "why not:" in out
    assert "lack attribute gpu.nvidia.com/nvlinkDomain" in out


def test_claim_file_with_its_pods_explains_the_claim(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The shipped examples keep the Pod beside its claim; explain takes them as they are."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "trainer", "namespace": "ml"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    claim = write(tmp_path / "with-pod.yaml", TP4, pod)
    code, out, err = run(
        [
            "-f",
            str(claim),
            "--slices",
            str(files["slices"]),
            "--deviceclass",
            str(files["classes"]),
        ],
        capsys,
    )
    assert (code, err) == (0, "")
    assert "ResourceClaimTemplate ml/tp4: allocatable on 1 of 2 node(s)" in out


def test_json_is_the_documented_shape_and_exit_1_when_nowhere(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tp9 = json.loads(json.dumps(TP4))
    tp9["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = 9
    claim = tmp_path / "tp9.json"
    claim.write_text(json.dumps(tp9))
    code, out, _ = run(
        [
            "-f",
            str(claim),
            "--slices",
            str(files["slices"]),
            "--deviceclass",
            str(files["classes"]),
            "-o",
            "json",
        ],
        capsys,
    )
    assert code == 1
    body = json.loads(out)
    assert body["claim"] == {"kind": "ResourceClaimTemplate", "namespace": "ml", "name": "tp4"}
    assert body["summary"] == {"nodes": 2, "allocatable": 0}
    nodes = {n["node"]: n for n in body["nodes"]}
    assert set(nodes) == {"p5-a", "g6e-a"}
    assert nodes["p5-a"]["allocatable"] is False
    assert nodes["p5-a"]["results"] == []
    assert "request gpus: needed 9, found 8 matching" in nodes["p5-a"]["reasons"]


def test_allocated_claims_and_node_filter(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    busy = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "busy", "namespace": "ml"},
        "spec": {"devices": {"requests": []}},
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "r", "driver": DRIVER, "pool": "p5-a", "device": f"gpu-{i}"}
                        for i in range(6)
                    ]
                }
            }
        },
    }
    allocated = tmp_path / "allocated.json"
    allocated.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [busy]}))
    code, out, _ = run(
        [
            "-f", str(files["claim"]),
            "--slices", str(files["slices"]),
            "--deviceclass", str(files["classes"]),
            "--allocated", str(allocated),
            "--node", "p5-a",
            "-o", "json",
        ],
        capsys,
    )  # fmt: skip
    assert code == 1
    body = json.loads(out)
    assert [n["node"] for n in body["nodes"]] == ["p5-a"]
    assert "6 devices allocated to other claims" in "\n".join(body["nodes"][0]["reasons"])


def test_class_listing_without_a_claim(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    only_h100 = write(tmp_path / "h100.yaml", H100_CLASS)
    code, out, _ = run(["--deviceclass", str(only_h100), "--slices", str(files["slices"])], capsys)
    assert code == 0
    assert "DeviceClass h100: selects 8 of 16 device(s)" in out
    code, out, _ = run(
        ["--deviceclass", str(only_h100), "--slices", str(files["slices"]), "-o", "json"], capsys
    )
    body = json.loads(out)
    assert body["summary"] == {"devices": 16, "selected": 8}
    rejected = [d for d in body["devices"] if not d["selected"]]
    assert {d["node"] for d in rejected} == {"g6e-a"}
    assert rejected[0]["reason"].startswith("class h100 selector #0 (")
    assert rejected[0]["reason"].endswith(": false")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-f", "{claim}"], "give --slices FILE or --cluster"),
        (["-f", "{tmp}/missing.yaml", "--slices", "{slices}"], "missing.yaml: cannot read"),
        (["-f", "{classes}", "--slices", "{slices}"], "expected one ResourceClaim"),
        (
            ["-f", "{claim}", "--slices", "{classes}"],
            "DeviceClass gpu.nvidia.com: expected ResourceSlice",
        ),
        (["-f", "{bad}", "--slices", "{slices}"], "bad.yaml: line 2, column"),
        (["--slices", "{slices}"], "give -f CLAIM_OR_TEMPLATE, or --deviceclass FILE"),
        (
            ["-f", "{claim}", "--slices", "{slices}", "--deviceclass", "{slices}"],
            "slices.yaml: no DeviceClass in it",
        ),
        (
            ["-f", "{claim}", "--slices", "{slices}", "--kubeconfig", "k"],
            "--kubeconfig needs --cluster",
        ),
    ],
)
def test_bad_input_exits_2_with_one_clear_line(
    argv: list[str],
    message: str,
    files: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "bad.yaml").write_text("kind: ResourceClaim\n  spec: [\n")
    paths = {k: str(v) for k, v in files.items()} | {
        "tmp": str(tmp_path),
        "bad": str(tmp_path / "bad.yaml"),
    }
    code, out, err = run([a.format(**paths) for a in argv], capsys)
    assert code == 2
    assert out == ""
    assert message in err and err.count("\n") == 1


def test_help_documents_json_and_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["explain", "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert '"allocatable"' in text and "exit status:" in text and "--cluster" in text


# --- --cluster against the local API server -----------------------------------------


async def seed(api_client: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from kubernetes.aio import client

    resource: Any = client.ResourceV1Api(api_client)  # takes plain dicts as bodies
    for text in (
        discover_yaml("p5.48xlarge", "p5-a", capsys),
        discover_yaml("p5.48xlarge", "p5-b", capsys),
    ):
        for obj in yaml.safe_load_all(text):
            await resource.create_resource_slice(obj)
    await resource.create_device_class(GPU_CLASS)
    busy: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "busy", "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [{"name": "r", "exactly": {"deviceClassName": DRIVER, "count": 5}}]
            }
        },
    }
    created = await resource.create_namespaced_resource_claim("default", busy)
    status = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "r", "driver": DRIVER, "pool": "p5-a", "device": f"gpu-{i}"}
                    for i in range(5)
                ]
            }
        }
    }
    body = {
        **busy,
        "metadata": {**busy["metadata"], "resourceVersion": created.metadata.resource_version},
        "status": status,
    }
    await resource.replace_namespaced_resource_claim_status("busy", "default", body)


async def test_cluster_reads_slices_classes_and_allocations(
    apiserver: LocalApiServer,
    api_client: Any,
    files: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    await seed(api_client, capsys)
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    argv = [
        "explain",
        "-f",
        str(files["claim"]),
        "--cluster",
        "--kubeconfig",
        str(kubeconfig),
        "-o",
        "json",
    ]
    capsys.readouterr()
    code = await asyncio.to_thread(main, argv)
    body = json.loads(capsys.readouterr().out)
    assert code == 0
    nodes = {n["node"]: n for n in body["nodes"]}
    # p5-a has 5 of 8 GPUs taken by "busy": 3 left, the claim goes to p5-b.
    assert nodes["p5-a"]["allocatable"] is False
    assert "5 devices allocated to other claims" in "\n".join(nodes["p5-a"]["reasons"])
    assert [r["device"] for r in nodes["p5-b"]["results"]] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    listed = {(r.verb, r.resource) for r in apiserver.requests.snapshot()}
    wanted = {
        ("list", f"resource.k8s.io/{r}")
        for r in ("resourceslices", "deviceclasses", "resourceclaims")
    }
    assert wanted <= listed


async def test_cluster_forbidden_says_what_to_grant(
    apiserver: LocalApiServer,
    files: dict[str, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    apiserver.faults.forbid("list", "resourceslices")
    kubeconfig = apiserver.write_kubeconfig(tmp_path / "kubeconfig")
    argv = ["explain", "-f", str(files["claim"]), "--cluster", "--kubeconfig", str(kubeconfig)]
    capsys.readouterr()
    code = await asyncio.to_thread(main, argv)
    err = capsys.readouterr().err
    assert code == 2
    assert (
        "list resourceslices.resource.k8s.io: HTTP 403: "
        "grant list on resourceslices.resource.k8s.io"
    ) in err


def test_cluster_unreachable_or_no_kubeconfig_exits_2(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        port = closed.getsockname()[1]
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                    "users": [{"name": "u", "user": {}}],
                    "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                    "current-context": "x",
                }
            )
        )
        claim = str(files["claim"])
        code, out, err = run(["-f", claim, "--cluster", "--kubeconfig", str(kubeconfig)], capsys)
    assert (code, out) == (2, "")
    assert (
        "list resourceslices.resource.k8s.io: no answer from the API server: Cannot connect" in err
    )
    missing = str(tmp_path / "missing")
    code, _, err = run(["-f", claim, "--cluster", "--kubeconfig", missing], capsys)
    assert code == 2
    assert f"kubeconfig {missing}: no such file" in err


def _claim(*selectors: str, count: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "default"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpus",
                        "exactly": {
                            "deviceClassName": DRIVER,
                            "count": count,
                            "selectors": [{"cel": {"expression": e}} for e in selectors],
                        },
                    }
                ]
            }
        },
    }


def test_every_failing_selector_of_a_request_is_reported(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    attrs = 'device.attributes["gpu.nvidia.com"]'
    claim = write(
        tmp_path / "c.yaml",
        GPU_CLASS,
        _claim(f'{attrs}.productName == "NVIDIA B200"', f"{attrs}.memory > 200000"),
    )
    code, out, _ = run(["-f", str(claim), "--slices", str(files["slices"]), "-o", "json"], capsys)
    assert code == 1
    body = json.loads(out)
    for node in body["nodes"]:
        reasons = "\n".join(node["reasons"])
        assert "gpus selector #0 (" in reasons and "gpus selector #1 (" in reasons, reasons
    assert body["advice"].startswith("no device passes the selectors")


def test_taken_devices_name_their_claims_and_advice_ends_the_table(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def holder(name: str, devices: list[tuple[str, str]]) -> dict[str, Any]:
        results = [
            {"request": "gpus", "driver": DRIVER, "pool": pool, "device": device}
            for pool, device in devices
        ]
        return {
            **_claim(),
            "metadata": {"name": name, "namespace": "ml"},
            "status": {"allocation": {"devices": {"results": results}}},
        }

    p5 = [("p5-a", f"gpu-{i}") for i in range(8)]
    g6e = [("g6e-a", f"gpu-{i}") for i in range(8)]  # a g6e.48xlarge has 8
    allocated = write(
        tmp_path / "allocated.yaml", holder("trainer", p5[:6] + g6e), holder("notebook", p5[6:])
    )
    claim = write(tmp_path / "c.yaml", GPU_CLASS, _claim())
    argv = ["-f", str(claim), "--slices", str(files["slices"]), "--allocated", str(allocated)]
    code, out, _ = run(argv, capsys)
    assert code == 1
    assert "held by ml/trainer (6), ml/notebook (2)" in out
    assert "held by ml/trainer (8)" in out
    last = out.rstrip("\n").splitlines()[-1]
    assert last == (
        "advice: the devices that fit are taken: delete or wait for the claims holding them "
        "(kubectl get resourceclaims -A), or add nodes"
    )


def test_a_misspelled_attribute_is_named_with_its_correction(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    claim = write(
        tmp_path / "c.yaml",
        GPU_CLASS,
        _claim('device.attributes["gpu.nvidia.com"].prodcutName == "NVIDIA H100 80GB HBM3"'),
    )
    code, out, _ = run(["-f", str(claim), "--slices", str(files["slices"])], capsys)
    assert code == 1
    assert (
        "  problem: spec.devices.requests[0].exactly.selectors[0].cel.expression: 1:36: "
        "gpu.nvidia.com publishes no attribute 'prodcutName'; did you mean productName?\n"
    ) in out
    assert out.rstrip("\n").splitlines()[-1] == (
        "advice: fix the claim first: `gpu-dra validate` shows every problem in it"
    )


EXAMPLE = Path(__file__).resolve().parents[1] / "charts" / "examples" / "tensor-parallel.yaml"


def test_offline_the_chart_classes_are_known_as_validate_knows_them(
    files: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    # No class file: the claim names the chart's gpu.nvidia.com, which validate accepts too.
    code, out, _ = run(["-f", str(EXAMPLE), "--slices", str(files["slices"])], capsys)
    assert code == 0, out
    assert "allocatable on 1 of 2 node(s)" in out
    assert "not found" not in out


def test_a_rendered_chart_serves_as_the_class_file(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.chart_render import render

    # RBAC, the DaemonSet and the policies come first in the render: all ignored.
    objects = render((), ["deviceClasses.gpu.name=my-gpus"])
    assert objects[0]["kind"] != "DeviceClass"
    chart = write(tmp_path / "chart.yaml", *objects)
    claim = json.loads(json.dumps(TP4).replace(DRIVER, "my-gpus"))
    claim["spec"]["spec"]["devices"]["constraints"][0]["matchAttribute"] = (
        "gpu.nvidia.com/nvlinkDomain"
    )
    mine = write(tmp_path / "mine.yaml", claim)
    argv = ["-f", str(mine), "--slices", str(files["slices"])]
    code, out, _ = run(argv, capsys)
    assert code == 1 and "device class my-gpus not found" in out
    code, out, _ = run([*argv, "--deviceclass", str(chart)], capsys)
    assert code == 0, out
    assert "allocatable on 1 of 2 node(s)" in out
