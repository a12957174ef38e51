"""The one way this project builds a ``kubernetes.aio`` client.

Every component names itself in the User-Agent, so the API server's audit log
(and the local API server's request log, which the RBAC test reads) can tell
the node daemon's requests from anyone else's.
"""

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING, cast

from driver.common.errors import PermanentError

if TYPE_CHECKING:
    from kubernetes.aio.client import Configuration

    from driver.kube.session import Session

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


# The service account's files, as the kubelet mounts them into every pod.
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
# How long a read token is used before the file is read again: the kubelet rotates a
# projected token well before it expires; client-go and the kubernetes package re-read
# it every minute too.
TOKEN_REREAD_S = 60.0


async def api_client(kubeconfig: str | PathLike[str] | None, *, component: str) -> "Session":
    """A session from ``kubeconfig``, or the in-cluster service account when it is None.

    Raises :class:`PermanentError` naming the source when the configuration
    cannot be loaded: retrying the same file will not help.
    """
    from kubernetes.aio.client import Configuration

    from driver.kube.session import Session

    # Checked first: the kubernetes package would log a warning and then blame current-context.
    if kubeconfig and not await asyncio.to_thread(Path(kubeconfig).is_file):
        raise PermanentError(f"kubeconfig {kubeconfig}: no such file")
    configuration = Configuration()
    if kubeconfig:
        await _load_kubeconfig(kubeconfig, configuration)
    else:
        await asyncio.to_thread(incluster, configuration)
    # With trust_env, aiohttp looks up the proxy and ~/.netrc in a worker thread on every
    # request (0.4 ms of each claim fetch of the kubelet plugin, and a thread it
    # shares with fsyncs). The environment of a running process does not change:
    # look the proxy up once, as client-go's ProxyFromEnvironment does.
    configuration.client_session_kwargs = {"trust_env": False}
    if not configuration.proxy:
        configuration.proxy = _env_proxy(configuration.host)
    session = Session(configuration)
    session.user_agent = user_agent(component)
    return session


async def _load_kubeconfig(kubeconfig: str | PathLike[str], configuration: "Configuration") -> None:
    # The package's loader (auth plugins, exec credentials, contexts): imported only here,
    # by its module's full name, so the daemon's in-cluster start never loads it.
    from kubernetes.aio.config import ConfigException, load_kube_config

    # The kubernetes package leaves it untyped.
    load = cast(Callable[..., Awaitable[None]], load_kube_config)
    try:
        await load(config_file=str(kubeconfig), client_configuration=configuration)
    except (ConfigException, OSError) as exc:
        raise PermanentError(
            f"cannot load kubeconfig {kubeconfig}: {kubeconfig_hint(str(exc))}"
        ) from exc


def incluster(
    configuration: "Configuration",
    *,
    environ: Mapping[str, str] = os.environ,
    account: Path = SERVICE_ACCOUNT,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Point ``configuration`` at the API server by the pod's service account.

    What every in-cluster client reads (client-go's ``InClusterConfig``, the kubernetes
    package's loader): ``KUBERNETES_SERVICE_HOST`` and ``KUBERNETES_SERVICE_PORT``, the
    token and the CA under ``account``; the token file is read again once a minute, as
    the kubelet rotates it. Written here rather than loaded from the package because the
    package's loader sits beside its kubeconfig loader, which the daemon does not use
    (see :mod:`driver.kube.deferredinit`). Raises :class:`PermanentError` saying what is
    missing.
    """
    host = environ.get("KUBERNETES_SERVICE_HOST", "")
    port = environ.get("KUBERNETES_SERVICE_PORT", "")
    if not host or not port:
        raise PermanentError(
            "cannot load the in-cluster service account: "
            + kubeconfig_hint("Service host/port is not set.")
        )
    token_file, ca_file = account / "token", account / "ca.crt"

    def read_token() -> str:
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            raise PermanentError(
                f"cannot load the in-cluster service account: token {token_file}: "
                f"{exc.strerror or exc}"
            ) from exc
        if not token:
            raise PermanentError(
                f"cannot load the in-cluster service account: token {token_file} is empty"
            )
        return token

    try:
        ca_empty = ca_file.stat().st_size == 0
    except OSError as exc:
        raise PermanentError(
            f"cannot load the in-cluster service account: CA {ca_file}: {exc.strerror or exc}"
        ) from exc
    if ca_empty:
        raise PermanentError(f"cannot load the in-cluster service account: CA {ca_file} is empty")
    # An IPv6 address goes in brackets, as Go's net.JoinHostPort writes it.
    netloc = f"[{host}]:{port}" if ":" in host or "%" in host else f"{host}:{port}"
    configuration.host = f"https://{netloc}"
    configuration.ssl_ca_cert = str(ca_file)
    configuration.api_key["BearerToken"] = read_token()
    configuration.api_key_prefix["BearerToken"] = "Bearer"
    read_at = clock()

    def refresh(config: "Configuration") -> None:
        # Called before each request's headers; a read that fails keeps the last token
        # (the server answers 401 if it has expired, which the callers back off on).
        nonlocal read_at
        if clock() - read_at < TOKEN_REREAD_S:
            return
        read_at = clock()
        with contextlib.suppress(PermanentError):
            config.api_key["BearerToken"] = read_token()

    # The package types the hook's default (None), not the hook.
    configuration.refresh_api_key_hook = refresh  # type: ignore[assignment]


async def client_from_kubeconfig(config_file: str | None, *, component: str) -> "Session":
    """A session from ``config_file``, or the kubeconfig kubectl would read when it is None
    (``$KUBECONFIG``, ``~/.kube/config``): for the command line, not the daemons.

    Raises what ``kubernetes.aio.config.load_kube_config`` raises (``ConfigException``,
    ``OSError``) unchanged.
    """
    from kubernetes.aio.client import Configuration
    from kubernetes.aio.config import load_kube_config

    from driver.kube.session import Session

    load = cast(Callable[..., Awaitable[None]], load_kube_config)  # the package leaves it untyped
    configuration = Configuration()
    await load(config_file=config_file, client_configuration=configuration)
    session = Session(configuration)
    session.user_agent = user_agent(component)
    return session


async def close(session: "Session") -> None:
    """``ApiClient.close``, which the kubernetes package leaves untyped."""
    close_session = cast(Callable[[], Awaitable[None]], session.close)
    await close_session()


def _env_proxy(url: str) -> str | None:
    """HTTPS_PROXY / HTTP_PROXY for ``url`` unless NO_PROXY exempts its host."""
    from urllib.parse import urlsplit
    from urllib.request import getproxies, proxy_bypass

    parts = urlsplit(url)
    proxy = getproxies().get(parts.scheme)
    if proxy and parts.hostname and not proxy_bypass(parts.hostname):
        return str(proxy)
    return None
