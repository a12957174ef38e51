"""Failure cases users of NVIDIA's driver report (facts §1.5), tried on ours and on NVIDIA's
plugin v0.4.1 on one real node (issue #40 item 5). By hand, as the benchmark::

    GPU_DRA_E2E_RUN=/tmp/nk-fail flock /tmp/gpu-dra-e2e.lock .venv/bin/python \\
        -m tests.e2e.netns .venv/bin/python -m tests.e2e.side_by_side_failures [--out F]

Each case runs on each plugin (:mod:`tests.e2e.side_by_side`), and what happened is printed
as a table and as JSON; nothing here asserts which plugin "should" pass: the record is the
point, and a step that fails is recorded with its error and the case goes on where it can.

- fresh node: the plugin starts before the driver has made ``/dev/nvidia*`` (NV#1380: the
  first pod on a fresh node gets a CDI spec without them); the nodes appear once it runs,
  then a one-GPU pod lists the ``/dev/nvidia*`` it got.
- restart: a pod holds a GPU, the plugin is stopped (SIGTERM) and started again; the pod
  keeps running, its deletion is unprepared by the new process, and a new pod runs.
- node reboot: a pod holds a GPU and the node loses power (:meth:`SideBySide.power_cycle`:
  the kubelet, containerd, every container and the plugin killed, tmpfs ``/run`` lost with the
  CDI specs, a new boot ID) and boots; the kubelet runs the pod again in a new sandbox,
  preparing its claim again, and a new pod runs.
- GPU off the bus: a pod holds a GPU that then reports XID 79 and answers
  ``NVML_ERROR_GPU_IS_LOST`` to ``nvmlDeviceGetHandleByIndex`` / ``ByUUID`` (the simulated
  library's faults; ours re-reads them on SIGHUP, its rediscovery signal, which NVIDIA's
  plugin has no handler for: a Go process exits on SIGHUP, so it gets none and reads them at
  its next NVML init); then what the slices and the pod say, a plugin restart with the GPU
  still lost, and the holding pod's deletion.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

from tests.e2e import netns, side_by_side
from tests.e2e.kube import await_until
from tests.e2e.side_by_side import NODE, NS, PROFILE, Plugin, SideBySide

LIST_DEV = "ls /dev | grep nvidia | sort | tr '\\n' ' '; echo; exec sleep 3600"
XID_FELL_OFF_THE_BUS = 79


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc)[:300]}"


async def listed_devices(side: SideBySide, name: str) -> str:
    """Run a pod that lists its /dev/nvidia*; what it listed."""
    side.cp.call("POST", f"/api/v1/namespaces/{NS}/pods", side.pod_body(name, LIST_DEV))
    try:
        await await_until(f"{name} Running", lambda: side.phase(name) == "Running", 90)
    except TimeoutError as exc:
        raise RuntimeError(f"{exc}: {side.describe(name)}") from exc
    return str(await await_until(f"{name}'s listing", lambda: side.pod_log(name), 30))


def render(side: SideBySide, lost: int | None) -> None:
    """The node's hardware file, with GPU ``lost`` (minor) fallen off the bus, or healthy."""
    from driver.nvml.faults import Faults, XidEvent, gpu_lost
    from driver.nvml.profile import load_profile
    from driver.nvml.simulated import SimulatedNvml

    faults = Faults()
    if lost is not None:
        faults = Faults(
            xid_events=(XidEvent(gpu=lost, xid=XID_FELL_OFF_THE_BUS),),
            failing_queries=gpu_lost(lost),
        )
    nvml = SimulatedNvml(load_profile(PROFILE), side.driver_root, node_name=NODE, faults=faults)
    assert nvml.render() == side.hardware


def new(side: SideBySide, name: str) -> Plugin:
    return side.ours() if name == "ours" else side.nvidia()


async def restart(side: SideBySide, name: str, wait_s: float = 60) -> Plugin:
    """Stop the current plugin and start a new one of the same kind, its slices left as they
    are (a restart, not a switch); returns once it runs, registered and its pool complete."""
    old = side.current
    assert old is not None
    await old.stop()
    plugin = new(side, name)
    await plugin.start()
    side.current = plugin

    def ready() -> bool:
        if not plugin.alive():
            raise RuntimeError(f"{name} exited:\n{plugin.log()[-1500:]}")
        return bool(side.complete_pool()) and plugin.registered()

    await side.cp.wait_for(f"{name} back", ready, wait_s)
    return plugin


async def fresh_node(side: SideBySide, name: str) -> dict[str, Any]:
    from driver.nvml.simulated import SimulatedNode

    out: dict[str, Any] = {}
    await side.stop()
    dev = side.driver_root / "dev"
    for p in dev.glob("nvidia*"):
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    plugin = new(side, name)
    try:
        out["start_s"] = round(await side.start(plugin, 60), 2)
        out["devices_published"] = len(side.devices())
    except (RuntimeError, TimeoutError) as exc:
        out["start"] = _short(exc)
        out["log_tail"] = plugin.log()[-600:]
        await side.stop()
    SimulatedNode(PROFILE, NODE, side.driver_root)  # the driver makes its device nodes
    if side.current is None:  # it did not come up: started again now that they are there
        try:
            out["start_after_nodes_s"] = round(await side.start(new(side, name), 60), 2)
        except (RuntimeError, TimeoutError) as exc:
            out["start_after_nodes"] = _short(exc)
            await side.stop()
            return out
    await _one_pod(side, f"fresh-{name}", out, "first_pod")
    return out


async def _one_pod(side: SideBySide, pod: str, out: dict[str, Any], key: str) -> None:
    """A pod that lists its devices, then deleted: ``out[key + "_dev"]`` what it listed, or
    ``out[key]`` what failed."""
    try:
        out[f"{key}_dev"] = await listed_devices(side, pod)
        await side.delete_pod(pod)
    except (RuntimeError, TimeoutError) as exc:
        out[key] = _short(exc)


async def plugin_restart(side: SideBySide, name: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    await side.switch(new(side, name))
    hold = f"hold-{name}"
    out["before_dev"] = await listed_devices(side, hold)
    started = side.pod(hold)["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
    try:
        await restart(side, name)
        out["restarted"] = True
    except (RuntimeError, TimeoutError) as exc:
        out["restarted"] = _short(exc)
        return out
    status = side.pod(hold)["status"]["containerStatuses"][0]
    out["pod_still_running_same_container"] = (
        side.phase(hold) == "Running"
        and status["restartCount"] == 0
        and status["state"].get("running", {}).get("startedAt") == started
    )
    await _release_then_one_more(side, hold, f"next-{name}", out, "unprepare_after_restart")
    return out


async def node_reboot(side: SideBySide, name: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    await side.switch(new(side, name))
    hold = f"boot-{name}"
    out["before_dev"] = await listed_devices(side, hold)
    before = side.pod(hold)["status"]["containerStatuses"][0]["restartCount"]
    await side.power_cycle()
    plugin = side.current
    assert plugin is not None

    def back() -> bool:
        if not plugin.alive():
            raise RuntimeError(f"{name} exited:\n{plugin.log()[-1500:]}")
        return bool(side.complete_pool()) and plugin.registered()

    try:
        await side.cp.wait_for(f"{name} back after the reboot", back, 90)
        out["plugin_back"] = True
    except (RuntimeError, TimeoutError) as exc:
        out["plugin_back"] = _short(exc)
        out["log_tail"] = plugin.log()[-600:]
        return out

    def restarted() -> bool:
        status = (side.pod(hold).get("status", {}).get("containerStatuses") or [{}])[0]
        return "running" in status.get("state", {}) and status["restartCount"] > before

    try:  # the kubelet makes a new sandbox and prepares the pod's claim again
        await await_until(f"{hold} running again", restarted, 150)
        out["after_reboot_dev"] = side.pod_log(hold).splitlines()[-1]
        out["cdi_spec_written_again"] = bool(side.specs())
    except TimeoutError as exc:
        out["pod_after_reboot"] = f"{_short(exc)}: {side.describe(hold)[-700:]}"
        return out
    await _release_then_one_more(side, hold, f"after-boot-{name}", out, "unprepare_after_reboot")
    return out


async def _release_then_one_more(
    side: SideBySide, hold: str, pod: str, out: dict[str, Any], key: str
) -> None:
    """The holding pod deleted (``out[key]``: whether its claim was unprepared), then
    :func:`_one_pod` ``pod`` (``out["next_pod..."]``)."""
    try:
        await side.delete_pod(hold, wait_s=60)
        out[key] = "ok (spec removed, claim deleted)"
    except TimeoutError as exc:
        out[key] = _short(exc)
    await _one_pod(side, pod, out, "next_pod")


def _device_of(side: SideBySide, pod: str) -> str:
    (claim,) = [c for c in side.claims() if c["metadata"]["name"].startswith(f"{pod}-")]
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    return str(result["device"])


def _published(side: SideBySide, device: str) -> dict[str, Any] | None:
    found = [d for d in side.devices() if d["name"] == device]
    return found[0] if found else None


def _pod_health(side: SideBySide, pod: str) -> list[str]:
    statuses = side.pod(pod).get("status", {}).get("containerStatuses") or []
    return [
        str(r.get("health"))
        for s in statuses
        for a in s.get("allocatedResourcesStatus") or []
        for r in a.get("resources") or []
    ]


async def off_the_bus(side: SideBySide, name: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    await side.switch(new(side, name))
    victim = f"victim-{name}"
    await listed_devices(side, victim)
    device = _device_of(side, victim)
    entry = _published(side, device)
    assert entry is not None
    # Ours publishes the minor; NVIDIA's does not, and names a GPU by its index, which is
    # its minor on the simulated node (as on most real ones).
    minor = int(entry["attributes"].get("minor", {}).get("int", device.rsplit("-", 1)[1]))
    out["device"] = device
    render(side, minor)
    try:
        await _lost(side, name, victim, device, out)
    finally:
        render(side, None)  # a healthy node again for the next case
    return out


async def _lost(side: SideBySide, name: str, victim: str, device: str, out: dict[str, Any]) -> None:
    plugin = side.current
    assert plugin is not None
    if name == "ours":
        os.kill(plugin.pid, signal.SIGHUP)

    def noticed() -> bool:  # in the pod's status: the last a user is told of, if at all
        return "Unhealthy" in _pod_health(side, victim)

    # Not seen after 30 s is an answer too (NVIDIA's default gates watch no XID).
    with contextlib.suppress(TimeoutError):
        await await_until("the loss seen in the pod's status", noticed, 30)
    seen = _published(side, device)
    out["after_event_device"] = (
        "withdrawn" if seen is None else f"taints {seen.get('taints') or 'none'}"
    )
    out["after_event_pod_health"] = _pod_health(side, victim) or "none reported"
    out["after_event_plugin_alive"] = plugin.alive()
    out["victim_running"] = side.phase(victim) == "Running"
    try:
        await restart(side, name)
        out["restart_with_gpu_lost"] = f"up, {len(side.devices())} devices published"
        seen = _published(side, device)
        out["lost_device_after_restart"] = (
            "withdrawn" if seen is None else f"published, taints {seen.get('taints') or 'none'}"
        )
    except (RuntimeError, TimeoutError) as exc:
        out["restart_with_gpu_lost"] = _short(exc)
    out["victim_running_after_restart"] = side.phase(victim) == "Running"
    if side.current is not None and side.current.alive():
        try:
            await side.delete_pod(victim, wait_s=60)
            out["unprepare_lost_gpu"] = "ok"
        except TimeoutError as exc:
            out["unprepare_lost_gpu"] = _short(exc)


async def cleanup(side: SideBySide, name: str) -> None:
    """No pod left (their claims unprepared by a running plugin of ``name``), no plugin."""
    pods = side.cp.call("GET", f"/api/v1/namespaces/{NS}/pods")["items"]
    if pods and (side.current is None or not side.current.alive()):
        await side.stop()
        await side.start(new(side, name), 60)
    for pod in pods:
        await side.delete_pod(pod["metadata"]["name"], wait_s=60)
    await side.stop()


CASES = {
    "fresh node": fresh_node,
    "plugin restart": plugin_restart,
    "node reboot": node_reboot,
    "GPU off the bus": off_the_bus,
}


async def run(cases: list[str], plugins: list[str]) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    async with side_by_side.side_by_side("sbf") as side:
        for case in cases:
            fn = CASES[case]
            results[case] = {}
            for name in plugins:
                try:
                    results[case][name] = await fn(side, name)
                except Exception as exc:  # recorded: the next case still runs
                    results[case][name] = {"error": _short(exc)}
                    log = side.current.log()[-800:] if side.current else ""
                    results[case][name]["log_tail"] = log
                print(f"{case}, {name}: {json.dumps(results[case][name])[:1500]}",
                      file=sys.stderr, flush=True)  # fmt: skip
                # Each (case, plugin) starts from a clean node: no pod, the plugin stopped.
                try:
                    await cleanup(side, name)
                except (RuntimeError, TimeoutError) as exc:
                    results[case][name]["cleanup"] = _short(exc)
                    await side.stop()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--case", action="append", choices=list(CASES), help="default: all")
    parser.add_argument("--plugin", action="append", choices=["ours", "nvidia"])
    args = parser.parse_args(argv)
    if not netns.isolated() or side_by_side.missing():
        print(f"skipped: {side_by_side.missing() or 'run inside tests.e2e.netns'}")
        return 0
    results = asyncio.run(run(args.case or list(CASES), args.plugin or ["ours", "nvidia"]))
    for case, by in results.items():
        print(f"\n== {case}")
        for name, got in by.items():
            print(f"  {name}: {json.dumps(got)}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
