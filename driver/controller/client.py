"""Raw-JSON calls through the official ``kubernetes.aio`` client.

The ``ApiClient`` still does what it is for (server address, TLS, bearer tokens,
user agent); this module skips its typed models, which cost more CPU than the
controller itself, and turns HTTP outcomes into errors classed by whether a retry
helps. Every call names its Kubernetes verb and resource, so a 403 can say exactly
which permission is missing.
"""

import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import aiohttp
from kubernetes.aio.client import ApiClient

from driver.errors import DriverError, PermanentError, RetryableError

_Obj = dict[str, Any]
_Query = Sequence[tuple[str, str]]
_JSON_HEADERS = {"Accept": "application/json", "Content-Type": "application/json"}
# client-go's reflector asks for a server-side watch timeout between 5 and 10 minutes.
WATCH_TIMEOUT_SECONDS = 300


class ApiError(DriverError):
    """The API server answered a call with an error status (or not at all: ``status`` 0)."""

    def __init__(self, message: str, *, status: int, verb: str, resource: str) -> None:
        super().__init__(message)
        self.status = status
        self.verb = verb
        self.resource = resource


class ConflictError(ApiError, RetryableError):
    """409: the object changed (or exists); re-read and try again."""


class GoneError(ApiError, RetryableError):
    """410: the resourceVersion is too old to watch from; list again."""


class ServerError(ApiError, RetryableError):
    """429 or 5xx: back off and retry."""


class UnavailableError(ApiError, RetryableError):
    """No answer (refused, reset, timed out). For a write the outcome is unknown."""


class NotFoundError(ApiError, PermanentError):
    """404."""


class ForbiddenError(ApiError, PermanentError):
    """403: RBAC lacks a permission; the message names the verb and resource."""


class RejectedError(ApiError, PermanentError):
    """400/422 and other 4xx: the request itself is wrong."""


def _error(status: int, verb: str, resource: str, detail: str) -> ApiError:
    if status == 403:
        return ForbiddenError(
            f"forbidden: cannot {verb} {resource}; grant the ClusterRole of this driver "
            f"the verb {verb!r} on {resource} ({detail})",
            status=status,
            verb=verb,
            resource=resource,
        )
    text = f"{verb} {resource}: HTTP {status}: {detail}"
    cls: type[ApiError]
    if status == 404:
        cls = NotFoundError
    elif status == 409:
        cls = ConflictError
    elif status == 410:
        cls = GoneError
    elif status == 429 or status >= 500:
        cls = ServerError
    else:
        cls = RejectedError
    return cls(text, status=status, verb=verb, resource=resource)


def _detail(body: bytes) -> str:
    try:
        status = json.loads(body)
    except ValueError:
        return body[:200].decode("utf-8", "replace") or "no message"
    if isinstance(status, dict):
        return str(status.get("message") or status.get("reason") or "no message")
    return "no message"


class Client:
    """JSON in, JSON out, against one API server; see :class:`ApiError` for failures."""

    def __init__(self, api_client: ApiClient, *, request_timeout: float = 30.0) -> None:
        self._api = api_client
        self._timeout = request_timeout

    async def request(
        self,
        method: str,
        path: str,
        *,
        verb: str,
        resource: str,
        query: _Query = (),
        body: _Obj | None = None,
    ) -> _Obj:
        params = await self._api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(query),
            header_params=dict(_JSON_HEADERS),
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = await self._api.call_api(*params, _request_timeout=self._timeout)
            data: bytes = await response.response.read()
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise UnavailableError(
                f"{verb} {resource}: no answer from the API server: {exc!r}",
                status=0,
                verb=verb,
                resource=resource,
            ) from exc
        if not 200 <= response.status < 300:
            raise _error(response.status, verb, resource, _detail(data))
        result: _Obj = json.loads(data)
        return result

    async def watch(
        self, path: str, *, resource: str, query: _Query, read_timeout: float
    ) -> AsyncIterator[_Obj]:
        """Watch events as dicts, until the server ends the stream.

        ``read_timeout`` bounds the silence between two chunks, so a dead connection
        is noticed; bookmarks keep a healthy one talking.
        """
        params = await self._api.param_serialize(
            method="GET",
            resource_path=path,
            query_params=[*query, ("watch", "true"), ("allowWatchBookmarks", "true")],
            header_params=dict(_JSON_HEADERS),
            auth_settings=["BearerToken"],
        )
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self._timeout, sock_read=read_timeout
        )
        try:
            response = await self._api.call_api(*params, _request_timeout=timeout)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise UnavailableError(
                f"watch {resource}: {exc!r}", status=0, verb="watch", resource=resource
            ) from exc
        raw: aiohttp.ClientResponse = response.response
        try:
            if response.status != 200:
                raise _error(response.status, "watch", resource, _detail(await raw.read()))
            buffer = b""
            # Lines can be long (a slice of 128 devices), so split them ourselves rather
            # than rely on the stream reader's line-length limit.
            async for chunk in raw.content.iter_any():
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    event: _Obj = json.loads(line)
                    if event.get("type") == "ERROR":
                        status = event.get("object") or {}
                        raise _error(
                            int(status.get("code") or 500),
                            "watch",
                            resource,
                            str(status.get("message") or "watch error"),
                        )
                    yield event
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise UnavailableError(
                f"watch {resource}: stream broke: {exc!r}",
                status=0,
                verb="watch",
                resource=resource,
            ) from exc
        finally:
            # Close, not release: a half-read stream must not go back to the pool.
            raw.close()
