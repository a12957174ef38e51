"""Prometheus metrics over HTTP: ``GET /metrics`` on a port of its own, for every component.

One asyncio server on the component's loop: a bounded number of connections at a time (the
rest are closed at once), each given ``read_timeout`` to send its request, so a slow or hostile
client costs no thread and no unbounded memory. What it serves is the component's registry,
rendered at each scrape (:class:`Rendered`).
"""

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
from typing import Protocol

from prometheus_client.core import CounterMetricFamily

from driver.common.logs import kv

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Rendered(Protocol):
    def render(self) -> bytes:
        """The registry in Prometheus' text format."""
        ...


def counted(
    name: str, documentation: str, label: str, known: Sequence[str], counts: Mapping[str, int]
) -> CounterMetricFamily:
    """A counter family with every known label value (bounded: others are not reported)."""
    family = CounterMetricFamily(name, documentation, labels=[label])
    for value in known:
        family.add_metric([value], counts.get(value, 0))
    return family


_REQUEST_LIMIT = 8192  # bytes of request line and headers; a scrape sends a few hundred


class MetricsServer:
    """``GET /metrics`` on ``host``:``port`` (port 0: a free one, then :attr:`port` says
    which). ``host``: the pod's IP in the chart; loopback by default, so metrics are not
    offered on every interface of a host-network pod unless asked for."""

    def __init__(
        self,
        metrics: Rendered,
        *,
        port: int,
        host: str = "127.0.0.1",
        max_connections: int = 8,
        read_timeout: float = 10.0,
    ) -> None:
        self._metrics = metrics
        self._host = host
        self.port = port
        self._max = max_connections
        self._read_timeout = read_timeout
        self._active = 0
        self._server: asyncio.Server | None = None

    @property
    def address(self) -> tuple[str, int]:
        return self._host, self.port

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._connection, self._host, self.port, limit=_REQUEST_LIMIT
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        log.info(
            "serving metrics",
            extra=kv(address=self._host, port=self.port, max_connections=self._max),
        )

    async def stop(self) -> None:
        if self._server is not None:
            server, self._server = self._server, None
            server.close()
            await server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._active >= self._max:  # over the cap: no slot, and no wait for one
            writer.close()
            return
        self._active += 1
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self._read_timeout)
            method, _, rest = head.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
            path = rest.partition(" ")[0].partition("?")[0]
            if method not in ("GET", "HEAD"):
                status, body = "405 Method Not Allowed", b"GET only\n"
            elif path in ("/metrics", "/"):
                status, body = "200 OK", self._metrics.render()
            else:
                status, body = "404 Not Found", b"not found: GET /metrics\n"
            content_type = CONTENT_TYPE if status == "200 OK" else "text/plain; charset=utf-8"
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + (body if method != "HEAD" else b"")
            )
            await asyncio.wait_for(writer.drain(), self._read_timeout)
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass  # a client that is slow, gone or sends too much gets no answer
        finally:
            self._active -= 1
            writer.close()
            with contextlib.suppress(OSError, TimeoutError):
                await asyncio.wait_for(writer.wait_closed(), self._read_timeout)
