"""``gpu-dra validate`` held against the real kube-apiserver, the way CEL and the allocator are
held against upstream.

A seeded generator (tests/manifest_mutations.py) mutates valid DRA manifests; each case is
sent to the API server with ``dryRun=All`` and ``fieldValidation=Strict`` (what ``kubectl
apply`` sends), and run through ``validate --kubernetes-version <the server's>`` in-process,
given the server's DeviceClasses. Every case must agree: validate refuses what the server
refuses, naming a field the server names, and accepts (warnings allowed) what it accepts.
Only validate's API findings count here (``Check.API``); what no API server checks (names
nobody defines, selectors no device satisfies, our opaque config) has unit tests of its own.
A disagreement is fixed in validate with a unit test, or listed in ``DELIBERATE`` with why.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests import manifest_mutations
from tests.e2e import build
from tests.e2e.cluster import ControlPlane, collection_path, run_root
from tests.e2e.kube import chart_objects
from tools.validation import Check, Problem, Severity, parse_version, validate_sources

MINOR = os.environ.get("K8S") or str(build.VERSIONS["default"])
CASES = int(os.environ.get("GPU_DRA_ORACLE_CASES", "5000"))
SEED = 20261202
SENDERS = 8

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(900)]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def cluster() -> AsyncIterator[ControlPlane]:
    async with ControlPlane(run_root() / f"gpu-dra-e2e-oracle-{MINOR}", MINOR) as cp:
        for obj in chart_objects(cp.minor):
            if obj["kind"] == "DeviceClass":
                cp.create(obj)
        yield cp


# ---- the server's answer --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verdict:
    code: int
    fields: tuple[str, ...]  # the field paths the server names (no list indexes when 400)
    message: str

    @property
    def accepted(self) -> bool:
        return self.code == 201


_UNKNOWN = re.compile(r'(?:unknown|duplicate) field "([^"]+)"')
_UNMARSHAL = re.compile(r"Go struct field \w+\.([\w.]+) of type")


def server_fields(code: int, status: dict[str, Any]) -> tuple[str, ...]:
    """The fields a refusal names: the causes of a 422; for a 400 (the body did not decode),
    the fields its message names (``unknown field "spec.x"``, ``Go struct field
    T.spec.devices.requests.exactly.count``, which has no list indexes)."""
    causes = status.get("details", {}).get("causes", [])
    fields = [c["field"] for c in causes if c.get("field")]
    message = str(status.get("message", ""))
    fields += _UNKNOWN.findall(message) + _UNMARSHAL.findall(message)
    return tuple(dict.fromkeys(fields))


class Sender:
    """Dry-run creates over one kept-alive TLS connection per thread (a handshake per
    request would cost more than the request)."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.local = threading.local()

    def _connection(self) -> http.client.HTTPSConnection:
        conn: http.client.HTTPSConnection | None = getattr(self.local, "conn", None)
        if conn is None:
            conn = http.client.HTTPSConnection(
                "127.0.0.1", self.cp.api_port, context=self.cp.ssl_context(), timeout=30
            )
            self.local.conn = conn
        return conn

    def send(self, doc: dict[str, Any]) -> Verdict:
        path = collection_path(doc, "default") + "?dryRun=All&fieldValidation=Strict"
        body = json.dumps(doc).encode()
        for attempt in (1, 2):
            conn = self._connection()
            try:
                conn.request("POST", path, body, {"Content-Type": "application/json"})
                response = conn.getresponse()
                data = response.read()
                break
            except (http.client.HTTPException, OSError):
                # The server closed a kept-alive connection: one fresh try.
                conn.close()
                self.local.conn = None
                if attempt == 2:
                    raise
        status: dict[str, Any] = json.loads(data) if data else {}
        code = response.status
        if code == 201:
            return Verdict(code, (), "")
        return Verdict(code, server_fields(code, status), str(status.get("message", "")))


# ---- validate's answer and the comparison ---------------------------------------------


def _parts(path: str) -> list[str]:
    # Go's decoder names an embedded struct by its type (config.DeviceConfiguration.opaque):
    # JSON fields start lowercase, types do not. A map's key is a subscript to the server
    # (``requests[memory]``), a field to validate (``requests.memory``).
    path = re.sub(r"\[([^\]\d][^\]]*)\]", r".\1", path)
    return [p for p in re.sub(r"\[\d+\]", "", path).split(".") if p and not p[0].isupper()]


def same_field(ours: str, theirs: str) -> bool:
    """One path names the other's field or a field inside it (list indexes aside: a 400
    names none). The server reports some rules at the parent (``requests[0]: exactly one
    of``), validate some at the child, so a prefix of two parts or more counts."""
    a, b = _parts(ours), _parts(theirs)
    if a == b:
        return True
    short, long = (a, b) if len(a) < len(b) else (b, a)
    return len(short) >= 2 and long[: len(short)] == short


@dataclass(frozen=True, slots=True)
class Outcome:
    case: manifest_mutations.Case
    server: Verdict
    errors: tuple[Problem, ...]  # validate's API errors
    others: tuple[Problem, ...]  # validate's errors of the checks no API server makes

    @property
    def agrees(self) -> bool:
        if self.server.accepted:
            return not self.errors
        if not self.errors:
            return False
        if not self.server.fields:  # a decode error that names no field (a bad quantity)
            return True
        return any(same_field(p.path, f) for p in self.errors for f in self.server.fields)

    def describe(self) -> str:
        ours = [f"{p.path}: {p.message}" for p in self.errors] or ["accepted"]
        theirs = (
            "accepted"
            if self.server.accepted
            else f"{self.server.code} {list(self.server.fields)} {self.server.message[:400]}"
        )
        return (
            f"case {self.case.index} ({self.case.base}; {'; '.join(self.case.mutations)}):\n"
            f"  server:   {theirs}\n  validate: {' | '.join(ours)[:600]}"
        )


def validate_case(
    case: manifest_mutations.Case, version: tuple[int, int], known: list[dict[str, Any]]
) -> tuple[tuple[Problem, ...], tuple[Problem, ...]]:
    problems = validate_sources(
        [(f"case-{case.index}.yaml", json.dumps(case.doc))], version=version, known=known
    )
    errors = [p for p in problems if p.severity is Severity.ERROR]
    return (
        tuple(p for p in errors if p.check is Check.API),
        tuple(p for p in errors if p.check is not Check.API),
    )


# A disagreement that stays, and why: (what it is, a test of the outcome).
DELIBERATE: list[tuple[str, Callable[[Outcome], bool]]] = [
    (
        # Admission, not validation: the namespace's labels decide, and validate reads
        # manifests, not namespaces. It warns instead.
        "adminAccess needs a label on the namespace",
        lambda o: (
            not o.server.accepted
            and all(f.endswith(".adminAccess") for f in o.server.fields)
            and not o.errors
        ),
    ),
    (
        # The Job's name becomes a label of its pods; the server names that label, which
        # the user never wrote, validate the name, which is what to change.
        "a Job name too long for a label: validate names metadata.name",
        lambda o: (
            o.case.kind == "Job"
            and "spec.template.labels" in o.server.fields
            and any(p.path == "metadata.name" for p in o.errors)
        ),
    ),
]


def _explained(outcome: Outcome) -> str | None:
    for reason, applies in DELIBERATE:
        if applies(outcome):
            return reason
    return None


async def test_validate_and_the_api_server_agree_on_every_mutated_manifest(
    cluster: ControlPlane,
) -> None:
    version = parse_version(MINOR)
    classes = cluster.call("GET", "/apis/resource.k8s.io/v1/deviceclasses")["items"]
    known = [{**c, "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass"} for c in classes]
    cases = manifest_mutations.generate(SEED, CASES)
    started = time.monotonic()
    sender = Sender(cluster)
    with ThreadPoolExecutor(SENDERS) as pool:
        sent = pool.map(lambda c: sender.send(c.doc), cases)
        ours = [validate_case(c, version, known) for c in cases]
        verdicts = list(sent)
    elapsed = time.monotonic() - started
    outcomes = [
        Outcome(c, v, errors, others)
        for c, v, (errors, others) in zip(cases, verdicts, ours, strict=True)
    ]
    unexpected = [o for o in outcomes if o.server.code not in (201, 400, 422)]
    assert not unexpected, [o.describe() for o in unexpected[:5]]
    tally: Counter[str] = Counter()
    explained: Counter[str] = Counter()
    unexplained: list[Outcome] = []
    for o in outcomes:
        if o.agrees:
            tally["accepted by both" if o.server.accepted else "refused by both"] += 1
            continue
        reason = _explained(o)
        if reason is not None:
            explained[reason] += 1
            continue
        tally["disagreed"] += 1
        unexplained.append(o)
    beyond = sum(1 for o in outcomes if o.server.accepted and o.others)
    print(
        f"\n{len(cases)} manifests at {MINOR} in {elapsed:.1f} s: {dict(tally)}; "
        f"deliberate: {dict(explained)}; accepted by the server but refused by validate's "
        f"checks beyond the API: {beyond}"
    )
    for o in unexplained[:40]:
        print(o.describe())
    if dump := os.environ.get("GPU_DRA_ORACLE_DUMP"):  # every disagreement, to study
        text = "".join(o.describe() + "\n" for o in unexplained)
        await asyncio.to_thread(Path(dump).write_text, text, encoding="utf-8")
    assert not unexplained, f"{len(unexplained)} unexplained disagreements"
    assert tally["accepted by both"] > len(cases) // 10
    assert tally["refused by both"] > len(cases) // 3
