"""``gpu-dra validate`` on ComputeDomain objects and on claims with the ComputeDomain
driver's opaque configs: the CRDs' schema offline, what NVIDIA's controller and node driver
need beyond it, and messages that name the field, the value and what is allowed."""

import copy
import io
import json
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import yaml

from cli import main
from drivers.computedomain import names
from tests import computedomain_cases
from tests.computedomain_cases import UID, Case, aws_nvbandwidth, channel_injection
from tools.validation import Check, Problem, Severity, validate_sources
from tools.validation.computedomains import CLIQUE_SCHEMA, COMPUTE_DOMAIN_SCHEMA

CRDS = Path(__file__).resolve().parent.parent / "charts" / "gpu-dra-driver" / "crds"


def problems(*docs: Any) -> list[Problem]:
    return validate_sources([("cd.yaml", yaml.safe_dump_all(docs))])


def errors(*docs: Any, check: Check | None = None) -> list[Problem]:
    return [
        p
        for p in problems(*docs)
        if p.severity is Severity.ERROR and (check is None or p.check is check)
    ]


def _structural(schema: Any) -> Any:
    """A CRD schema as validate's copy spells it: no descriptions, no CEL rules (the one
    rule, spec's immutability, only an update can break)."""
    if isinstance(schema, dict):
        return {
            k: _structural(v)
            for k, v in schema.items()
            if k not in ("description", "x-kubernetes-validations")
        }
    if isinstance(schema, list):
        return [_structural(v) for v in schema]
    return schema


@pytest.mark.parametrize(
    ("file", "ours"),
    [
        ("resource.nvidia.com_computedomains.yaml", COMPUTE_DOMAIN_SCHEMA),
        ("resource.nvidia.com_computedomaincliques.yaml", CLIQUE_SCHEMA),
    ],
)
def test_validates_schema_is_the_crds(file: str, ours: Any) -> None:
    (version,) = yaml.safe_load((CRDS / file).read_text())["spec"]["versions"]
    assert json.loads(json.dumps(ours)) == _structural(version["schema"]["openAPIV3Schema"])


@pytest.mark.parametrize("case", computedomain_cases.CASES, ids=lambda c: c.name)
def test_validate_gives_the_api_servers_verdict(case: Case) -> None:
    found = problems(case.doc)
    api = [p.path for p in found if p.severity is Severity.ERROR and p.check is Check.API]
    if case.refused_at is None:
        assert api == []
    else:
        # validate may name a field inside the one the server names (a label's key).
        assert any(computedomain_cases.within(p, case.refused_at) for p in api), found
    beyond = [p.path for p in found if p.severity is Severity.ERROR and p.check is Check.CONTROLLER]
    assert beyond == ([case.controller] if case.controller else [])


def test_messages_name_the_value_and_what_is_allowed() -> None:
    cd = channel_injection()
    cd["spec"]["numNodes"] = -2
    cd["spec"]["channel"]["allocationMode"] = "single"
    cd["spec"]["chanel"] = {}
    lines = [str(p) for p in problems(cd)]
    assert lines == [
        "cd.yaml: ComputeDomain/imex-channel-injection: spec.chanel: error: unknown field "
        "'chanel' (known: numNodes, channel); did you mean channel?",
        "cd.yaml: ComputeDomain/imex-channel-injection: spec.numNodes: error: -2 must be at "
        "least 0",
        "cd.yaml: ComputeDomain/imex-channel-injection: spec.channel.allocationMode: error: "
        "'single' is not allowed: must be one of All, Single; did you mean Single?",
    ]
    cd = channel_injection()
    cd["spec"]["numNodes"] = "2"
    (problem,) = problems(cd)
    assert (problem.path, problem.message) == ("spec.numNodes", "must be an integer, not '2'")


def test_a_status_is_a_warning_that_it_is_ignored() -> None:
    cd = channel_injection()
    cd["status"] = {"status": "Ready"}
    (problem,) = problems(cd)
    assert (problem.path, problem.severity) == ("status", Severity.WARNING)
    assert "drops on create" in problem.message


def test_versions_and_kinds_the_crds_do_not_serve() -> None:
    cd = channel_injection()
    cd["apiVersion"] = "resource.nvidia.com/v1"
    (problem,) = errors(cd)
    assert problem.path == "apiVersion" and "only at resource.nvidia.com/v1beta1" in problem.message
    config = {
        "apiVersion": names.API_VERSION,
        "kind": names.CHANNEL_CONFIG_KIND,
        "metadata": {"name": "x"},
    }
    (problem,) = errors(config)
    assert problem.path == "kind" and "opaque config" in problem.message
    config["kind"] = "ComputeDomains"
    (problem,) = errors(config)
    assert "(the kinds: ComputeDomain, ComputeDomainClique)" in problem.message


def _workload(template: str, namespace: str = "default") -> dict[str, Any]:
    """A Job whose pods each claim a channel from ``template`` (as AWS's MPIJob workers)."""
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "w", "namespace": namespace},
        "spec": {
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {"name": "c", "image": "x", "resources": {"claims": [{"name": "ch"}]}}
                    ],
                    "resourceClaims": [{"name": "ch", "resourceClaimTemplateName": template}],
                }
            }
        },
    }


def test_the_domains_channel_template_counts_as_defined() -> None:
    cd = aws_nvbandwidth()
    template = cd["spec"]["channel"]["resourceClaimTemplate"]["name"]
    assert problems(cd, _workload(template)) == []
    # Known templates make every reference checked: a typo gets the closest name.
    (typo,) = errors(cd, _workload(template[:-1]))
    assert typo.check is Check.REFERENCE
    assert f"did you mean {template}?" in typo.message
    # The template is made in the domain's namespace, not the workload's.
    (elsewhere,) = errors(cd, _workload(template, namespace="other"))
    assert elsewhere.check is Check.REFERENCE
    # A container naming a request the channel template lacks.
    job = _workload(template)
    job["spec"]["template"]["spec"]["containers"][0]["resources"]["claims"][0]["request"] = "gpu"
    (request,) = errors(cd, job)
    assert "has no request 'gpu' (requests: channel)" in request.message


# ---- opaque configs in claims ------------------------------------------------------------


def _claim(*requests: tuple[str, str], configs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t"},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {"name": name, "exactly": {"deviceClassName": cls}}
                        for name, cls in requests
                    ],
                    "config": configs,
                }
            }
        },
    }


def _opaque(parameters: Any, *requests: str) -> dict[str, Any]:
    config: dict[str, Any] = {"opaque": {"driver": names.DRIVER_NAME, "parameters": parameters}}
    if requests:
        config["requests"] = list(requests)
    return config


CHANNEL = {"apiVersion": names.API_VERSION, "kind": names.CHANNEL_CONFIG_KIND, "domainID": UID,
           "allocationMode": "Single"}  # fmt: skip
DAEMON = {"apiVersion": names.API_VERSION, "kind": names.DAEMON_CONFIG_KIND, "domainID": UID}


def test_the_templates_nvidias_controller_writes_pass() -> None:
    # templates/compute-domain-{workload,daemon}-claim-template.tmpl.yaml, filled in.
    workload = _claim(
        ("channel", names.DEFAULT_CHANNEL_CLASS), configs=[_opaque(CHANNEL, "channel")]
    )
    daemon = _claim(("daemon", names.DAEMON_CLASS), configs=[_opaque(DAEMON, "daemon")])
    assert problems(workload) == [] and problems(daemon) == []


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        ({**CHANNEL, "domainID": ""}, 'ComputeDomainChannelConfig: field "domainID": cannot be'),
        ({**CHANNEL, "domainID": "cd-1"}, "'cd-1' is not a ComputeDomain UID"),
        ({**CHANNEL, "allocationMode": "all"}, "\"allocationMode\": 'all': Input should be 'All'"),
        (
            {**CHANNEL, "unexpectedField": 1},
            'field "unexpectedField": unknown field, not allowed (allowed there: allocationMode',
        ),
        ({**CHANNEL, "kind": "GpuConfig"}, "parameters: field \"kind\": 'GpuConfig' is not"),
        ({**CHANNEL, "apiVersion": "resource.nvidia.com/v1"}, 'field "apiVersion"'),
    ],
)
def test_a_config_the_node_driver_refuses(parameters: dict[str, Any], expected: str) -> None:
    claim = _claim(("channel", names.DEFAULT_CHANNEL_CLASS), configs=[_opaque(parameters)])
    (problem,) = errors(claim)
    assert problem.check is Check.PLUGIN
    assert problem.path == "spec.spec.devices.config[0].opaque.parameters"
    assert problem.message.startswith(
        "the compute-domain.nvidia.com node driver would reject it at prepare: "
    )
    assert expected in problem.message


def test_a_config_of_the_other_device_type_is_nvidias_error() -> None:
    claim = _claim(
        ("channel", names.DEFAULT_CHANNEL_CLASS),
        ("daemon", names.DAEMON_CLASS),
        configs=[_opaque(DAEMON, "channel"), _opaque(DAEMON, "daemon")],
    )
    (problem,) = errors(claim)
    assert problem.path == "spec.spec.devices.config[0].opaque.parameters.kind"
    assert problem.message.startswith("cannot apply ComputeDomainDaemonConfig to request: channel")
    # A config for every request (no requests list) meets both devices: one is wrong.
    both = _claim(
        ("channel", names.DEFAULT_CHANNEL_CLASS),
        ("daemon", names.DAEMON_CLASS),
        configs=[_opaque(CHANNEL)],
    )
    (problem,) = errors(both)
    assert "cannot apply ComputeDomainChannelConfig to request: daemon" in problem.message


def test_a_channel_claim_of_ones_own_has_no_domain() -> None:
    claim = _claim(("imex", names.DEFAULT_CHANNEL_CLASS), configs=[])
    (problem,) = errors(claim)
    assert problem.path == "spec.spec.devices.requests[0].exactly.deviceClassName"
    assert problem.check is Check.PLUGIN
    assert "no ComputeDomainChannelConfig applies to request 'imex'" in problem.message
    assert "spec.channel.resourceClaimTemplate.name" in problem.message
    # A config for another driver does not count; one for the request does.
    gpu = {"opaque": {"driver": "gpu.nvidia.com", "parameters": {}}, "requests": ["imex"]}
    assert len(errors(_claim(("imex", names.DEFAULT_CHANNEL_CLASS), configs=[gpu]))) >= 1
    fine = _claim(("imex", names.DEFAULT_CHANNEL_CLASS), configs=[_opaque(CHANNEL, "imex")])
    assert errors(fine) == []


def test_gpu_claims_are_untouched() -> None:
    claim = _claim(("gpu", "gpu.nvidia.com"), configs=[])
    assert problems(claim) == []


def test_cli_exit_status_and_lines(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump_all([aws_nvbandwidth(), _workload(
        "nvbandwidth-test-compute-domain-channel")]))  # fmt: skip
    bad_doc = copy.deepcopy(aws_nvbandwidth())
    bad_doc["spec"]["numNodes"] = -1
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(bad_doc))
    for path, code, lines in (
        (good, 0, ["2 objects, no problems"]),
        (
            bad,
            1,
            [
                f"{bad}: ComputeDomain/nvbandwidth-test-compute-domain: spec.numNodes: error: "
                "-1 must be at least 0"
            ],
        ),
    ):
        out = io.StringIO()
        with redirect_stdout(out):
            assert main(["validate", str(path)]) == code
        assert out.getvalue().splitlines() == lines
