"""Reading from the API server for the offline commands (``explain``, ``validate``).

One way to find the kubeconfig (``--kubeconfig``, else kubectl's lookup) and to say
what is wrong with it in one line, before any request is made.
"""

import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from driver.kube.session import Session

T = TypeVar("T")


def _default_kubeconfig_exists() -> bool:
    """Whether kubectl's lookup ($KUBECONFIG's paths, else ~/.kube/config) finds a file."""
    paths = os.environ.get("KUBECONFIG", "").split(os.pathsep)
    candidates = [Path(p) for p in paths if p] or [Path.home() / ".kube" / "config"]
    return any(p.is_file() for p in candidates)


def read(
    kubeconfig: Path | None, reader: Callable[["Session"], Awaitable[T]], *, component: str
) -> T:
    """``reader(api_client)`` against the cluster of ``kubeconfig``; ClusterAccessError
    (a PermanentError) when there is no usable kubeconfig."""
    import asyncio

    from tools.allocation.inputs import ClusterAccessError

    if kubeconfig is not None and not kubeconfig.is_file():
        raise ClusterAccessError(f"kubeconfig {kubeconfig}: no such file")
    if kubeconfig is None and not _default_kubeconfig_exists():
        raise ClusterAccessError(
            "no kubeconfig found ($KUBECONFIG unset or naming no file, no ~/.kube/config): "
            "pass --kubeconfig FILE or set $KUBECONFIG"
        )

    async def run() -> T:
        from kubernetes.aio.config import ConfigException

        from driver.kube.client import client_from_kubeconfig, kubeconfig_hint

        try:
            api = await client_from_kubeconfig(
                str(kubeconfig) if kubeconfig else None, component=component
            )
        except (ConfigException, OSError) as exc:
            raise ClusterAccessError(f"kubeconfig: {kubeconfig_hint(str(exc))}") from exc
        async with api:
            return await reader(api)

    return asyncio.run(run())
