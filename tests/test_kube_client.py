"""The configured client: in-cluster configuration read directly, the package's init deferred."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from kubernetes.aio.client import Configuration

from driver.common.errors import PermanentError
from driver.kube.client import TOKEN_REREAD_S, incluster
from driver.kube.session import Session

ENV = {"KUBERNETES_SERVICE_HOST": "10.100.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def account(tmp_path: Path, token: str = "token-1", ca: str = "PEM") -> Path:
    (tmp_path / "token").write_text(token)
    (tmp_path / "ca.crt").write_text(ca)
    return tmp_path


async def bearer(configuration: Configuration) -> str:
    settings = await configuration.auth_settings()
    return str(settings["BearerToken"]["value"])


async def test_incluster_reads_host_ca_and_token(tmp_path: Path) -> None:
    configuration = Configuration()
    incluster(configuration, environ=ENV, account=account(tmp_path))
    assert configuration.host == "https://10.100.0.1:443"
    assert configuration.ssl_ca_cert == str(tmp_path / "ca.crt")
    assert await bearer(configuration) == "Bearer token-1"


def test_incluster_brackets_an_ipv6_address(tmp_path: Path) -> None:
    configuration = Configuration()
    environ = {**ENV, "KUBERNETES_SERVICE_HOST": "fd00:10:96::1"}
    incluster(configuration, environ=environ, account=account(tmp_path))
    assert configuration.host == "https://[fd00:10:96::1]:443"


async def test_incluster_rereads_a_rotated_token_once_a_minute(tmp_path: Path) -> None:
    now = [1000.0]
    configuration = Configuration()
    incluster(configuration, environ=ENV, account=account(tmp_path), clock=lambda: now[0])
    (tmp_path / "token").write_text("token-2\n")  # the kubelet rotated it
    now[0] += TOKEN_REREAD_S - 1
    assert await bearer(configuration) == "Bearer token-1"
    now[0] += 1
    assert await bearer(configuration) == "Bearer token-2"
    (tmp_path / "token").unlink()  # a failed re-read keeps the last token
    now[0] += TOKEN_REREAD_S
    assert await bearer(configuration) == "Bearer token-2"


@pytest.mark.parametrize(
    ("environ", "token", "ca", "says"),
    [
        ({}, "t", "PEM", "not running in a cluster (no KUBERNETES_SERVICE_HOST)"),
        ({**ENV, "KUBERNETES_SERVICE_PORT": ""}, "t", "PEM", "not running in a cluster"),
        (ENV, None, "PEM", "token"),
        (ENV, "", "PEM", "is empty"),
        (ENV, "t", None, "No such file"),
        (ENV, "t", "", "is empty"),
    ],
)
def test_incluster_says_what_is_missing(
    tmp_path: Path, environ: dict[str, str], token: str | None, ca: str | None, says: str
) -> None:
    if token is not None:
        (tmp_path / "token").write_text(token)
    if ca is not None:
        (tmp_path / "ca.crt").write_text(ca)
    with pytest.raises(PermanentError, match="in-cluster service account") as raised:
        incluster(Configuration(), environ=environ, account=tmp_path)
    assert says in str(raised.value)


def test_daemon_start_leaves_the_kubernetes_package_inits_unrun(tmp_path: Path) -> None:
    """The node daemon's modules and a configured client load the transport only; the
    package's init still runs, in place, for whoever needs more of it."""
    script = textwrap.dedent(
        """
        import asyncio, sys
        import cli
        from cli import plugin
        from drivers.gpu import node
        from driver.kube import client, deferredinit
        from sandbox.apiserver import ThreadedApiServer

        with ThreadedApiServer() as server:
            path = server.write_kubeconfig(sys.argv[1])

            async def call():
                api = await client.api_client(path, component="test")
                from driver.kube.rest import Client
                version = await Client(api).get_json("/version", resource="/version")
                await client.close(api)
                return version["gitVersion"]

            print("version", asyncio.run(call()))
        def deferred():
            return deferredinit.deferred("kubernetes"), deferredinit.deferred("kubernetes.aio")

        print("deferred", *deferred())
        heavy = {"requests", "oauthlib", "websocket", "kubernetes.config", "kubernetes.client",
                 "kubernetes.aio.dynamic"}
        print("loaded", sorted(heavy & sys.modules.keys()))
        import kubernetes
        from kubernetes.aio import watch
        from kubernetes import client as sync_client
        print("later", kubernetes.__version__ != "", watch.Watch.__name__,
              sync_client.CoreV1Api.__name__)
        print("deferred", *deferred())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "kubeconfig")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[1],
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("version v1.")
    assert lines[1:] == [
        "deferred True True",
        "loaded []",
        "later True Watch CoreV1Api",
        "deferred False False",
    ]


async def test_request_bodies_are_compact_json_as_the_api_server_compares_them() -> None:
    """An opaque config's parameters are kept as the bytes sent; the server re-encodes them
    compactly when it checks a template's immutable spec, so anything else breaks every later
    patch of that template (seen on kube-apiserver 1.36)."""
    from aiohttp import web
    from kubernetes.aio import client

    from driver.kube.rest import Client

    bodies: list[bytes] = []

    async def record(request: web.Request) -> web.Response:
        bodies.append(await request.read())
        return web.json_response({"kind": "Status"})

    app = web.Application()
    app.router.add_route("*", "/{path:.*}", record)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    configuration = client.Configuration(host=f"http://127.0.0.1:{port}")
    body = {"spec": {"config": [{"opaque": {"parameters": {"a": 1, "b": "x"}}}]}}
    try:
        async with Session(configuration) as api:
            await Client(api).request("POST", "/x", verb="create", resource="x", body=body)
        # The package itself is left as it is for any other client in the process.
        async with client.ApiClient(configuration) as plain:
            params = await plain.param_serialize(
                method="POST", resource_path="/x", body=body,
                header_params={"Content-Type": "application/json"},
            )  # fmt: skip
            await plain.call_api(*params)
    finally:
        await runner.cleanup()
    assert bodies == [
        b'{"spec":{"config":[{"opaque":{"parameters":{"a":1,"b":"x"}}}]}}',
        b'{"spec": {"config": [{"opaque": {"parameters": {"a": 1, "b": "x"}}}]}}',
    ]
