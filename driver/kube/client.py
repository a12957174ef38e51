"""The one way this project builds a ``kubernetes.aio`` client.

Every component names itself in the User-Agent, so the API server's audit log
(and the local API server's request log, which the RBAC test reads) can tell
the node daemon's requests from anyone else's.
"""

import asyncio
from collections.abc import Awaitable, Callable
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, cast

from driver.common.errors import PermanentError

if TYPE_CHECKING:
    from kubernetes.aio.client import ApiClient

USER_AGENT_PREFIX = "gpu-dra"


def kubeconfig_hint(message: str) -> str:
    """The kubernetes package's kubeconfig messages, said in the user's terms."""
    if "current-context" in message or "No configuration found" in message:
        return (
            "no usable kubeconfig: it names no current-context; pass --kubeconfig FILE, set "
            "$KUBECONFIG, or run `kubectl config use-context NAME`"
        )
    if "Service host/port is not set" in message:
        return (
            "not running in a cluster (no KUBERNETES_SERVICE_HOST) and no kubeconfig given: "
            "pass --kubeconfig FILE or set $KUBECONFIG"
        )
    return message


def release() -> str:
    """This package's version from its installed metadata; ``dev`` in a bare source tree."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpu-dra-driver")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "dev"


def user_agent(component: str) -> str:
    """``gpu-dra/<version> (<component>)``."""
    return f"{USER_AGENT_PREFIX}/{release()} ({component})"


async def api_client(kubeconfig: str | PathLike[str] | None, *, component: str) -> "ApiClient":
    """A client from ``kubeconfig``, or the in-cluster service account when it is None.

    Raises :class:`PermanentError` naming the source when the configuration
    cannot be loaded: retrying the same file will not help.
    """
    from kubernetes.aio import config
    from kubernetes.aio.client import ApiClient, Configuration

    # Checked first: the kubernetes package would log a warning and then blame current-context.
    if kubeconfig and not await asyncio.to_thread(Path(kubeconfig).is_file):
        raise PermanentError(f"kubeconfig {kubeconfig}: no such file")
    configuration = Configuration()
    # The kubernetes package leaves these untyped.
    load_kube_config = cast(Callable[..., Awaitable[None]], config.load_kube_config)
    load_incluster_config = cast(Callable[..., None], config.load_incluster_config)
    try:
        if kubeconfig:
            await load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
        else:
            load_incluster_config(client_configuration=configuration)
    except (config.ConfigException, OSError) as exc:
        where = f"kubeconfig {kubeconfig}" if kubeconfig else "the in-cluster service account"
        raise PermanentError(f"cannot load {where}: {kubeconfig_hint(str(exc))}") from exc
    # With trust_env, aiohttp looks up the proxy and ~/.netrc in a worker thread on every
    # request (0.4 ms of each claim fetch of the kubelet plugin, and a thread it
    # shares with fsyncs). The environment of a running process does not change:
    # look the proxy up once, as client-go's ProxyFromEnvironment does.
    configuration.client_session_kwargs = {"trust_env": False}
    if not configuration.proxy:
        configuration.proxy = _env_proxy(configuration.host)
    client = ApiClient(configuration=configuration)
    client.user_agent = user_agent(component)
    return client


async def client_from_kubeconfig(config_file: str | None, *, component: str) -> "ApiClient":
    """``kubernetes.aio.config.new_client_from_config``, which the package leaves untyped.

    Raises what it raises (``config.ConfigException``, ``OSError``) unchanged.
    """
    from kubernetes.aio import config

    new_client = cast(Callable[..., Awaitable["ApiClient"]], config.new_client_from_config)
    client = await new_client(config_file=config_file)
    client.user_agent = user_agent(component)
    return client


async def close(client: "ApiClient") -> None:
    """``ApiClient.close``, which the kubernetes package leaves untyped."""
    close_client = cast(Callable[[], Awaitable[None]], client.close)
    await close_client()


def _env_proxy(url: str) -> str | None:
    """HTTPS_PROXY / HTTP_PROXY for ``url`` unless NO_PROXY exempts its host."""
    from urllib.parse import urlsplit
    from urllib.request import getproxies, proxy_bypass

    parts = urlsplit(url)
    proxy = getproxies().get(parts.scheme)
    if proxy and parts.hostname and not proxy_bypass(parts.hostname):
        return str(proxy)
    return None
