"""The ComputeDomain driver's two device kinds, ``channel`` and ``daemon``, and its flavor.

Published (NVIDIA's ``deviceinfo.go``): one pool named after the node, one slice with
``channel-0`` and ``daemon-0``, attributes ``type`` and ``id``.

A channel claim (a workload's, NVIDIA's ``applyComputeDomainChannelConfigDriverManaged``):
its domain must be of the claim's namespace; the node is labelled with the domain, which
brings the domain's IMEX daemon here; the prepare then waits, boundedly, for that daemon to be
Ready on this node, and ends PreparePending if it is not yet (the label stays, the kubelet
retries). The container gets IMEX channel 0, or every channel with ``allocationMode: All``,
as CDI device nodes made from the ``nvidia-caps-imex-channels`` major, and
``GPU_DRA_IMEX_CHANNELS`` naming them; none without a clique (the variable empty).
Channel 0 is reserved like any device, so one channel claim is prepared per node at a time;
another waits (retryable), as NVIDIA's "channel 0 already allocated".

A daemon claim (the domain's DaemonSet pod, from the controller's template in the driver's
namespace; a claim elsewhere is refused, since the domain is found cluster-wide): the domain's
directory ``<plugin dir>/domains/<cdUID>`` mounted at ``/imexd``, the domain's identity in the
environment, and with a clique the IMEX management capability node. The directory is removed
with the last daemon claim of the domain on the node (NVIDIA leaves it to a 10-minute sweep);
its unprepare asks nothing of the API server, so a domain deleted before its daemon pods end
is no obstacle.

A prepared claim's ``status.devices`` entry (``status_data``) names, for either kind, the
domain (namespace, name, UID) and the node's clique ID.

Both kinds have side effects (the label, the directory), so the framework writes the claim's
record before them and recovery undoes them after a crash. Their API calls are coroutines of
the node's event loop; a kind's methods run in a worker thread and wait on them there.
"""

import asyncio
import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from api.computedomain import (
    KINDS as CONFIG_KINDS,
)
from api.computedomain import (
    ComputeDomainChannelConfig,
    ComputeDomainConfig,
    decode_compute_domain_config,
)
from api.config import ConfigError
from driver.common.crashpoints import crashpoint
from driver.common.errors import PermanentError
from driver.common.fsutil import ensure_dir, write_atomic
from driver.common.limits import is_uid
from driver.devicekind import DeviceKind, KindContext, NodeDevice, PreparedClaim, PreparedDevice
from driver.kube.backoff import Backoff
from drivers.computedomain import names, nvcaps
from drivers.computedomain.domains import (
    DomainNotFoundError,
    Domains,
    ForeignDaemonClaimError,
    NotReadyError,
)
from kubeletplugin.flavor import ConfigRules, Flavor
from kubeletplugin.state import PreparePendingError

T = TypeVar("T")
# The IMEX channels a workload got, as a range ("0", "0-2047"; empty on a node without a
# clique), beside the device nodes: as GPU_DRA_VISIBLE_GPU_UUIDS is for GPUs.
CHANNELS_ENV = "GPU_DRA_IMEX_CHANNELS"

CDI_VENDOR = "k8s.compute-domain.nvidia.com"
RECORD_KIND = "ComputeDomainDraClaimRecord"
DOMAINS_DIR = "domains"
DOMAIN_DIR_MODE = 0o755  # NVIDIA's: the daemon container reads and writes it as root
IMEXD = "/imexd"
# How long a channel prepare waits for the daemon inside one kubelet call (its 45 s timeout,
# less the claim fetch and the writes), and the backoff of its polls (NVIDIA's rate limiter).
GATE_TIMEOUT_S = 40.0
GATE_BACKOFF = (0.25, 3.0)
# A bound on one API call (or the whole daemon wait) seen from the worker thread: never hit
# unless the loop is stuck, since every call has its own request timeout and the wait its bound.
_CALL_TIMEOUT_S = 300.0

# What a prepared device records of its config (PreparedDevice.sharing).
CONFIG_KIND = "configKind"
DOMAIN_ID = "domainID"
ALLOCATION_MODE = "allocationMode"


class WrongConfigError(PermanentError):
    """A channel config on a daemon device, or the reverse."""


@dataclass(frozen=True, slots=True)
class DomainConfig:
    """A decoded ComputeDomain config, as the claim plan carries it."""

    model: ComputeDomainConfig

    def sharing_settings(self) -> tuple[tuple[str, str], ...]:
        settings = [(CONFIG_KIND, self.model.kind), (DOMAIN_ID, self.model.domain_id)]
        if isinstance(self.model, ComputeDomainChannelConfig):
            settings.append(
                (ALLOCATION_MODE, self.model.allocation_mode or names.ALLOCATION_SINGLE)
            )
        return tuple(sorted(settings))


def _decode(parameters: Mapping[str, Any] | None, source: str) -> DomainConfig:
    return DomainConfig(decode_compute_domain_config(parameters, source=source))


def _validate(config: DomainConfig, source: str) -> DomainConfig:
    try:
        config.model.validate_supported()
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from exc
    return config


CONFIGS = ConfigRules(
    kinds=CONFIG_KINDS,
    decode=_decode,
    validate=_validate,
    # NVIDIA's default names no domain, so a device without a config is refused.
    default=lambda: DomainConfig(ComputeDomainChannelConfig.default()),
)


def _published(name: str, device_type: str) -> dict[str, Any]:
    return {
        "name": name,
        "attributes": {
            names.TYPE_ATTRIBUTE: {"string": device_type},
            names.ID_ATTRIBUTE: {"int": 0},
        },
    }


def _settings(claim: PreparedClaim, kind: str) -> tuple[PreparedDevice, dict[str, str]]:
    """The claim's device of ``kind`` and its recorded config, checked to be that kind's."""
    device = next(d for d in claim.devices if d.kind == kind)
    settings = dict(device.sharing)
    want = names.CONFIG_KIND_OF_TYPE[kind]
    if settings.get(CONFIG_KIND) != want:
        raise WrongConfigError(
            f"cannot apply {settings.get(CONFIG_KIND, 'no config')} to request: "
            f"{','.join(device.request_names)} (device {device.device_name} takes a {want})"
        )
    return device, settings


class _Kind:
    """What both kinds share: the loop their API calls run on, the node's clique."""

    name = ""
    device = ""
    identity_keys: Sequence[str] = ()

    def __init__(
        self,
        *,
        loop: asyncio.AbstractEventLoop,
        domains: Domains,
        clique: Callable[[], str],
        proc_root: Path,
        plugin_dir: Path,
    ) -> None:
        self._loop = loop
        self._domains = domains
        self._clique = clique
        self._proc_root = proc_root
        self._plugin_dir = plugin_dir
        self._state_dir = plugin_dir / "kinds" / self.name

    def _call(self, work: Coroutine[Any, Any, T]) -> T:
        """Run an API call on the node's loop from this worker thread, and wait for it."""
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(_CALL_TIMEOUT_S)

    def devices(self, inventory: object, *, node_name: str) -> Sequence[NodeDevice]:
        return [NodeDevice(self.name, self.device, _published(self.device, self.name), {})]

    def attach(self, context: KindContext) -> None:
        self._state_dir = context.state_dir

    def has_side_effects(self, claim: PreparedClaim) -> bool:
        return True

    def watch(self) -> None:
        pass


class ChannelKind(_Kind):
    name = names.CHANNEL_TYPE
    device = names.CHANNEL_DEVICE

    def __init__(
        self,
        *,
        loop: asyncio.AbstractEventLoop,
        domains: Domains,
        clique: Callable[[], str],
        proc_root: Path,
        plugin_dir: Path,
        gate_timeout: float = GATE_TIMEOUT_S,
    ) -> None:
        super().__init__(
            loop=loop, domains=domains, clique=clique, proc_root=proc_root, plugin_dir=plugin_dir
        )
        self.gate_timeout = gate_timeout

    def claim_edits(self, devices: Sequence[NodeDevice], claim: PreparedClaim) -> Mapping[str, Any]:
        _, settings = _settings(claim, self.name)
        if not self._clique():
            # No fabric: no channel to give (NVIDIA injects nothing). The variable keeps the
            # CDI device valid (it may not be empty) and says so to the workload.
            return {"env": [f"{CHANNELS_ENV}="]}
        count = names.IMEX_CHANNEL_COUNT if settings.get(ALLOCATION_MODE) == "All" else 1
        channels_major = nvcaps.read_major(self._proc_root, nvcaps.IMEX_CHANNELS)
        return {
            "env": [f"{CHANNELS_ENV}={'0' if count == 1 else f'0-{count - 1}'}"],
            "deviceNodes": nvcaps.channel_nodes(channels_major, count),
        }

    def prepare(self, claim: PreparedClaim) -> None:
        _, settings = _settings(claim, self.name)
        uid = settings[DOMAIN_ID]
        domain = self._call(self._domains.check_namespace(uid, claim.namespace))
        self._call(self._domains.add_label(uid))
        crashpoint("cd-after-label")
        first, cap = GATE_BACKOFF
        try:
            self._call(
                self._domains.wait_ready(
                    domain,
                    self._clique(),
                    within=self.gate_timeout,
                    backoff=Backoff(base=first, cap=cap),
                )
            )
        except NotReadyError as exc:
            raise PreparePendingError(f"claim {claim}: {exc}") from exc

    def unprepare(self, claim: PreparedClaim) -> None:
        device = next((d for d in claim.devices if d.kind == self.name), None)
        uid = dict(device.sharing).get(DOMAIN_ID) if device is not None else None
        if uid:
            self._call(self._domains.remove_label(uid))

    def recover(self, claim: PreparedClaim) -> None:
        self.unprepare(claim)


class DaemonKind(_Kind):
    name = names.DAEMON_TYPE
    device = names.DAEMON_DEVICE

    def domain_dir(self, uid: str) -> Path:
        return self._plugin_dir / DOMAINS_DIR / uid

    def _holder(self, uid: str, claim_uid: str) -> Path:
        return self._state_dir / uid / f"{claim_uid}.json"

    @contextlib.contextmanager
    def _domain_lock(self, uid: str) -> Any:
        """The domain's directory is shared by its daemon claims on the node (an old pod's
        unprepare beside a new pod's prepare): made and removed under one lock."""
        ensure_dir(self._state_dir / uid, 0o750)
        fd = os.open(self._state_dir / f"{uid}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def claim_edits(self, devices: Sequence[NodeDevice], claim: PreparedClaim) -> Mapping[str, Any]:
        _, settings = _settings(claim, self.name)
        uid = settings[DOMAIN_ID]
        clique = self._clique()
        try:
            who = json.loads(self._holder(uid, claim.uid).read_text())
        except (OSError, ValueError):
            who = {}  # before its prepare: the spec is built again after it
        edits: dict[str, Any] = {
            "env": [
                # The driver's binaries and libraries come with the toolkit's edits; no GPU
                # is the daemon's (NVIDIA's daemon spec says the same).
                "NVIDIA_VISIBLE_DEVICES=void",
                f"CLIQUE_ID={clique}",
                f"COMPUTE_DOMAIN_UUID={uid}",
                f"COMPUTE_DOMAIN_NAME={who.get('name', '')}",
                f"COMPUTE_DOMAIN_NAMESPACE={who.get('namespace', '')}",
            ],
            "mounts": [
                {
                    "hostPath": str(self.domain_dir(uid)),
                    "containerPath": IMEXD,
                    "options": ["rw", "nosuid", "nodev", "bind"],
                }
            ],
        }
        if clique:
            cap = nvcaps.read_imex_mgmt(self._proc_root)
            edits["deviceNodes"] = [
                {
                    "path": f"/dev/nvidia-caps/nvidia-cap{cap.minor}",
                    "type": "c",
                    "major": nvcaps.read_major(self._proc_root, nvcaps.CAPS),
                    "minor": cap.minor,
                    "fileMode": cap.mode,
                }
            ]
        return edits

    def prepare(self, claim: PreparedClaim) -> None:
        _, settings = _settings(claim, self.name)
        uid = settings[DOMAIN_ID]  # a UID: the config decoder refuses anything else
        # The domain is found cluster-wide (the daemon serves a domain of any namespace), so
        # the claim's own namespace is what proves the controller made it: a tenant's claim
        # would otherwise get another namespace's /imexd and the IMEX capability.
        if claim.namespace != self._domains.namespace:
            raise ForeignDaemonClaimError(
                f"claim {claim}: a ComputeDomain daemon claim must be in the driver's "
                f"namespace ({self._domains.namespace}), not {claim.namespace}"
            )
        domain = self._call(self._domains.find(uid))
        with self._domain_lock(uid):
            holder = json.dumps({"name": domain.name, "namespace": domain.namespace}).encode()
            write_atomic(self._holder(uid, claim.uid), holder, fsync=False)
            ensure_dir(self.domain_dir(uid), DOMAIN_DIR_MODE, parent_mode=0o750)
        crashpoint("cd-after-domain-dir")

    def unprepare(self, claim: PreparedClaim) -> None:
        device = next((d for d in claim.devices if d.kind == self.name), None)
        uid = dict(device.sharing).get(DOMAIN_ID) if device is not None else None
        if not uid or not is_uid(uid):
            return
        with self._domain_lock(uid):
            self._holder(uid, claim.uid).unlink(missing_ok=True)
            if not any((self._state_dir / uid).glob("*.json")):
                shutil.rmtree(self.domain_dir(uid), ignore_errors=True)
                with contextlib.suppress(OSError):
                    (self._state_dir / uid).rmdir()

    def recover(self, claim: PreparedClaim) -> None:
        self.unprepare(claim)


async def status_data(
    domains: Domains, clique_id: str, claim: PreparedClaim, device: PreparedDevice
) -> dict[str, Any]:
    """What a claim's ``status.devices`` entry says of a channel or daemon device beyond its
    attributes and config: its domain (namespace, name, UID) and the node's clique, whose
    IMEX channels the device gives ("": a node without one, no channel given). A domain
    deleted meanwhile keeps its UID alone; other failures are the API's, which the status
    writer retries."""
    uid = dict(device.sharing).get(DOMAIN_ID)
    if not uid:
        return {}
    domain = {"uid": uid}
    # A channel's domain is of the claim's namespace (its prepare checked it); a daemon claim,
    # in the driver's namespace, serves a domain of any.
    where = claim.namespace if device.kind == names.CHANNEL_TYPE else ""
    with contextlib.suppress(DomainNotFoundError):
        found = await domains.named(uid, where)
        domain.update(namespace=found.namespace, name=found.name)
    return {"computeDomain": domain, "cliqueID": clique_id}


def flavor(channel: ChannelKind, daemon: DaemonKind) -> Flavor:
    table: Mapping[str, DeviceKind[object, KindContext]] = MappingProxyType(
        {channel.name: channel, daemon.name: daemon}
    )
    return Flavor(
        cdi_vendor=CDI_VENDOR,
        record_kind=RECORD_KIND,
        kinds=table,
        configs=CONFIGS,
        device_taken_is_retryable=True,
        toolkit_kinds=frozenset({daemon.name}),
        foreign_kinds=(f"{CDI_VENDOR}/",),
    )
