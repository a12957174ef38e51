"""The report's sections, rendered from what the demo did (pure: data in, text out)."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sandbox.demo._kubelet import NodeRun
from sandbox.demo._report import short_list, table
from sandbox.demo._scheduler import PodOutcome, claim_key


@dataclass
class Placed:
    """One example pod: its object, its claims by pod claim name, where it went."""

    pod: dict[str, Any]
    claims: dict[str, dict[str, Any]]
    outcome: PodOutcome


def _indent(text: str, spaces: int) -> str:
    return "\n".join(" " * spaces + line for line in text.splitlines())


def misfits(placed: Sequence[Placed]) -> list[list[object]]:
    """(claim, node, reason) for every node a claim was tried on and did not fit."""
    return [
        [claim_key(entry.claim), verdict.node, "; ".join(verdict.reasons)]
        for entry in (e for p in placed for e in p.outcome.claims)
        for verdict in (entry.explanation.nodes if entry.explanation else ())
        if not verdict.allocatable
    ]


def pod_view(namespace: str, outcome: PodOutcome) -> str:
    """Each claim of the pod tried on every node, then where the pod went."""
    lines = [f"\npod {namespace}/{outcome.pod}"]
    for entry in outcome.claims:
        key = claim_key(entry.claim)
        if entry.explanation is None:
            lines.append(f"  claim {key}: already allocated ({short_list(entry.devices)})")
            continue
        rows: list[list[object]] = []
        for verdict in entry.explanation.nodes:
            if verdict.allocatable:
                what = short_list([r.device for r in verdict.results])
            else:
                what = "; ".join(verdict.reasons)
            rows.append([verdict.node, "yes" if verdict.allocatable else "no", what])
        lines.append(f"  claim {key}")
        lines.append(_indent(table(["NODE", "FITS", "DEVICES / WHY NOT"], rows), 4))
    if outcome.node:
        lines.append(f"  -> scheduled on {outcome.node}")
    else:
        lines.append(f"  -> cannot be scheduled: {outcome.reason}")
    return "\n".join(lines)


def allocations(placed: Sequence[Placed]) -> str:
    rows: list[list[object]] = []
    for item in placed:
        outcome = item.outcome
        for entry in outcome.claims:
            status = entry.claim.get("status") or {}
            reserved = [r["name"] for r in status.get("reservedFor") or ()]
            rows.append(
                [
                    item.pod["metadata"]["name"],
                    claim_key(entry.claim),
                    outcome.node or "(unschedulable)",
                    short_list(entry.devices),
                    short_list(reserved) if outcome.node else outcome.reason,
                ]
            )
    return table(["POD", "CLAIM", "NODE", "DEVICES", "RESERVED FOR / WHY NOT"], rows)


def prepared(runs: Sequence[NodeRun]) -> str:
    lines = [
        table(
            ["NODE", "REGISTERED ENDPOINT", "VERSION"],
            [[r.node, r.endpoint, r.version] for r in runs],
        ),
        "\nCDI device IDs returned by NodePrepareResources",
        table(
            ["NODE", "POD", "CLAIM", "REQUEST", "DEVICE", "CDI DEVICE ID"],
            [
                [r.node, d.pod, d.claim, ",".join(d.requests), d.device, " ".join(d.cdi_ids)]
                for r in runs
                for d in r.devices
            ],
        ),
        "\ncontainer edits, resolved from the CDI specs on disk as a runtime would",
    ]
    for run in runs:
        for view in run.containers:
            edits = view.edits
            lines.append(
                f"{view.pod}/{view.container} on {run.node} ({', '.join(edits.spec_files)})"
            )
            lines.append(f"    device nodes: {' '.join(edits.device_nodes)}")
            lines.extend(f"    env: {env}" for env in edits.env)
            lines.append(f"    mounts: {edits.mounts}, hooks: {edits.hooks}")
    lines.extend(f"ERROR on {run.node}: {error}" for run in runs for error in run.errors)
    return "\n".join(lines)


def unprepared(runs: Sequence[NodeRun], specs_left: Mapping[str, int]) -> str:
    rows: list[list[object]] = [
        [
            run.node,
            key,
            f"error: {error}" if error else "ok",
            f"LEFT: {', '.join(left)}" if left else "removed",
        ]
        for run in runs
        for key, (error, left) in run.unprepared.items()
    ]
    lines = [table(["NODE", "CLAIM", "UNPREPARE", "CDI SPEC"], rows)]
    lines.extend(f"CDI specs left on {node}: {count}" for node, count in specs_left.items())
    return "\n".join(lines)


def summary(placed: Sequence[Placed], runs: Sequence[NodeRun], failures: Sequence[str]) -> str:
    scheduled = [p for p in placed if p.outcome.node]
    claims = {claim_key(e.claim) for p in scheduled for e in p.outcome.claims}
    prepared = {d.claim for r in runs for d in r.devices}
    clean = {k for r in runs for k, (error, left) in r.unprepared.items() if not error and not left}
    lines = [
        f"pods scheduled: {len(scheduled)} of {len(placed)}",
        f"claims allocated: {len(claims)}, prepared: {len(prepared)}, "
        f"unprepared cleanly: {len(clean)}",
        f"problems: {len(failures)}",
    ]
    lines.extend(f"  {failure}" for failure in failures)
    return "\n".join(lines)
