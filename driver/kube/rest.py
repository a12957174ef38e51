"""The one way this project calls the API server: JSON through the ``kubernetes.aio`` client.

The :class:`~driver.kube.session.Session` (the package's ``ApiClient``) still does what it is
for (server address, TLS, bearer tokens, user agent); this module skips its typed models, which
cost more CPU than the callers themselves, and turns every outcome into one error
class that says whether a retry helps and how soon. Every call names its Kubernetes
verb and resource, so a 403 can say exactly which permission is missing.

The classes, and the retry each gets from the callers:

==================  ==============================  ======================================
HTTP                class                           retry
==================  ==============================  ======================================
no answer, reset    :class:`UnavailableError`       backoff (a write's outcome is unknown)
429, 5xx            :class:`ServerError`            backoff
409                 :class:`ConflictError`          re-read, then retry (backoff)
410                 :class:`GoneError`              list again
200, not JSON       :class:`BadResponseError`       backoff
401                 :class:`UnauthorizedError`      slow backoff (credentials rotate)
403                 :class:`ForbiddenError`         slow backoff (RBAC may be fixed)
403, admission      :class:`AdmissionRefusedError`  slow backoff; this object was refused
404                 :class:`NotFoundError`          the caller decides (often: "gone")
400, 422, other     :class:`RejectedError`          slow backoff (the server may change)
==================  ==============================  ======================================

``ApiError.slow`` marks the classes whose cause waits on a person: callers that
retry them use a longer cap, so a stuck node does not hammer the API server.

Connections: the budget of a call (``request_timeout``) starts when the call has a
connection of the client's pool to itself, not before. Without that, a burst of
calls larger than the pool (2,000 claims in one NodePrepareResources) spends the
budget of the last ones waiting for a free connection, and they time out although
the API server answered each call in milliseconds.
"""

import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import ClassVar

import aiohttp
from kubernetes.aio.client.exceptions import ApiException

from driver.common.errors import DriverError, PermanentError, RetryableError
from driver.common.wire import Obj
from driver.kube.resources import Resource
from driver.kube.session import Session

_Query = Sequence[tuple[str, str]]
_JSON_HEADERS = {"Accept": "application/json", "Content-Type": "application/json"}
MERGE_PATCH = "application/merge-patch+json"  # RFC 7386: a null removes a field
# client-go's reflector asks for a server-side watch timeout between 5 and 10 minutes.
WATCH_TIMEOUT_SECONDS = 300


class ApiError(DriverError):
    """The API server answered a call with an error status (or not at all: ``status`` 0).

    ``status_object`` is the Kubernetes ``Status`` the server sent, when it sent one.
    """

    slow: ClassVar[bool] = False

    def __init__(
        self,
        message: str,
        *,
        status: int,
        verb: str,
        resource: str,
        status_object: Obj | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.verb = verb
        self.resource = resource
        self.status_object = status_object or {}


class ConflictError(ApiError, RetryableError):
    """409: the object changed (or exists); re-read and try again."""


class GoneError(ApiError, RetryableError):
    """410: the resourceVersion is too old to watch from; list again."""


class ServerError(ApiError, RetryableError):
    """429 or 5xx: back off and retry."""


class UnavailableError(ApiError, RetryableError):
    """No answer (refused, reset, timed out). For a write the outcome is unknown."""


class BadResponseError(ApiError, RetryableError):
    """A success status whose body is not a JSON object (a proxy in the way, a cut stream)."""


class NotFoundError(ApiError, PermanentError):
    """404."""


class UnauthorizedError(ApiError, PermanentError):
    """401: the credentials are not accepted."""

    slow = True


class ForbiddenError(ApiError, PermanentError):
    """403: RBAC lacks a permission, or an admission policy or webhook refused the request;
    the message says which, and names the verb and resource."""

    slow = True


class AdmissionRefusedError(ForbiddenError):
    """403 from an admission policy or webhook, not from RBAC: the verb is granted, and this
    request (this object, these values) was refused. Another object, or this one changed,
    may be admitted, so a caller that writes many objects goes on with the others."""


class RejectedError(ApiError, PermanentError):
    """400/422 and other 4xx: the request itself is wrong (or the server cannot take it)."""

    slow = True


def _all_subclasses(cls: type[ApiError]) -> list[type[ApiError]]:
    return [c for sub in cls.__subclasses__() for c in (sub, *_all_subclasses(sub))]


# The classes above by name (AdmissionRefusedError too, though a ForbiddenError): a fixed set,
# for metrics that report each (0 until it happens).
ERROR_CLASSES = tuple(sorted(c.__name__ for c in _all_subclasses(ApiError)))


def error_for(
    status: int, verb: str, resource: str, detail: str, status_object: Obj | None = None
) -> ApiError:
    """The one mapping of an HTTP status to an error class."""
    if status == 403:
        # RBAC let an admission refusal through: granting the verb would change nothing. The
        # API server's own words tell them apart (a ValidatingAdmissionPolicy: "... denied
        # request: ...", a webhook: "admission webhook ... denied the request: ..."); both
        # answer 403 with reason Forbidden, as RBAC does.
        if "denied request" in detail or "denied the request" in detail:
            return AdmissionRefusedError(
                f"refused by admission: cannot {verb} {resource}: {detail}",
                status=status,
                verb=verb,
                resource=resource,
                status_object=status_object,
            )
        return ForbiddenError(
            f"forbidden: cannot {verb} {resource}; grant the ClusterRole of this driver "
            f"the verb {verb!r} on {resource} ({detail})",
            status=status,
            verb=verb,
            resource=resource,
            status_object=status_object,
        )
    text = f"{verb} {resource}: HTTP {status}: {detail}"
    cls: type[ApiError]
    if status == 0:
        cls = UnavailableError
    elif status == 401:
        cls = UnauthorizedError
    elif status == 404:
        cls = NotFoundError
    elif status == 409:
        cls = ConflictError
    elif status == 410:
        cls = GoneError
    elif status == 429 or status >= 500:
        cls = ServerError
    elif 200 <= status < 300:
        cls = BadResponseError
    else:
        cls = RejectedError
    return cls(text, status=status, verb=verb, resource=resource, status_object=status_object)


def _status_object(body: bytes) -> Obj | None:
    try:
        status = json.loads(body)
    except ValueError:
        return None
    return status if isinstance(status, dict) else None


def _detail(body: bytes, status: Obj | None) -> str:
    if status is None:
        return body[:200].decode("utf-8", "replace") or "no message"
    return str(status.get("message") or status.get("reason") or "no message")


def _failure(status: int, verb: str, resource: str, body: bytes) -> ApiError:
    status_object = _status_object(body)
    return error_for(status, verb, resource, _detail(body, status_object), status_object)


class Client:
    """JSON in, JSON out, against one API server; see :class:`ApiError` for failures.

    Cheap to make: one per component or per call, all sharing ``session``'s pool, slots and
    error counts.
    """

    def __init__(self, session: Session, *, request_timeout: float = 30.0) -> None:
        self._api = session
        self._timeout = request_timeout
        self._slots = session.slots
        self._errors = session.errors

    async def request(
        self,
        method: str,
        path: str,
        *,
        verb: str,
        resource: str,
        query: _Query = (),
        body: Obj | None = None,
        content_type: str = "application/json",
    ) -> Obj:
        """One call; ``content_type`` names a PATCH body's kind (``MERGE_PATCH``)."""
        try:
            return await self._request(method, path, verb, resource, query, body, content_type)
        except ApiError as exc:
            self._errors[type(exc).__name__] += 1
            raise

    async def _request(
        self,
        method: str,
        path: str,
        verb: str,
        resource: str,
        query: _Query,
        body: Obj | None,
        content_type: str,
    ) -> Obj:
        params = await self._api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(query),
            header_params={**_JSON_HEADERS, "Content-Type": content_type},
            body=body,
            auth_settings=["BearerToken"],
        )
        async with self._slots:  # waiting here is not part of the call's budget
            try:
                response = await self._api.call_api(*params, _request_timeout=self._timeout)
                status = int(response.status)
                data: bytes = await response.response.read()  # read() frees the connection
            except ApiException as exc:  # the client's own retries (Retry-After) gave up
                raw = exc.body if isinstance(exc.body, bytes) else str(exc.body or "").encode()
                raise _failure(int(exc.status or 0), verb, resource, raw) from exc
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                raise UnavailableError(
                    f"{verb} {resource}: no answer from the API server: {_text(exc)}",
                    status=0,
                    verb=verb,
                    resource=resource,
                ) from exc
        if not 200 <= status < 300:
            raise _failure(status, verb, resource, data)
        try:
            result = json.loads(data)
        except ValueError as exc:
            raise error_for(status, verb, resource, f"the answer is not JSON: {exc}") from exc
        if not isinstance(result, dict):
            raise error_for(status, verb, resource, "the answer is not a JSON object")
        return result

    async def get_json(self, path: str, *, resource: str, query: _Query = ()) -> Obj:
        """GET a document that is no object's (``/version``, a discovery document)."""
        return await self.request("GET", path, verb="get", resource=resource, query=query)

    async def get(self, kind: Resource, name: str, *, namespace: str = "") -> Obj:
        """GET one object."""
        path = kind.path(name, namespace=namespace)
        return await self.request("GET", path, verb="get", resource=kind.rbac())

    async def create(
        self, kind: Resource, body: Obj, *, namespace: str = "", query: _Query = ()
    ) -> Obj:
        """POST a new object (``query``: ``dryRun``); the stored object comes back."""
        path = kind.path(namespace=namespace)
        return await self.request(
            "POST", path, verb="create", resource=kind.rbac(), query=query, body=body
        )

    async def update(self, kind: Resource, body: Obj, *, subresource: str = "") -> Obj:
        """PUT ``body`` over the object its metadata names (its resourceVersion, when it
        has one, makes a stale update a 409)."""
        meta = body["metadata"]
        path = kind.path(meta["name"], namespace=meta.get("namespace", ""), subresource=subresource)
        return await self.request(
            "PUT", path, verb="update", resource=kind.rbac(subresource), body=body
        )

    async def patch(
        self,
        kind: Resource,
        name: str,
        body: Obj,
        *,
        namespace: str = "",
        subresource: str = "",
        content_type: str = MERGE_PATCH,
    ) -> Obj:
        """PATCH one object, a JSON merge patch unless ``content_type`` says otherwise."""
        path = kind.path(name, namespace=namespace, subresource=subresource)
        return await self.request(
            "PATCH",
            path,
            verb="patch",
            resource=kind.rbac(subresource),
            body=body,
            content_type=content_type,
        )

    async def delete(
        self, kind: Resource, name: str, *, namespace: str = "", body: Obj | None = None
    ) -> Obj:
        """DELETE one object; ``body``: DeleteOptions (preconditions, propagation)."""
        path = kind.path(name, namespace=namespace)
        return await self.request("DELETE", path, verb="delete", resource=kind.rbac(), body=body)

    async def list_all(
        self, kind: Resource, *, namespace: str = "", query: _Query = (), limit: int = 500
    ) -> list[Obj]:
        """Every item of a collection (in ``namespace``, or all), page by page (``limit`` and
        ``continue``)."""
        path, resource = kind.path(namespace=namespace), kind.rbac()
        items: list[Obj] = []
        token = ""
        while True:
            page_query = [*query, ("limit", str(limit))]
            if token:
                page_query.append(("continue", token))
            page = await self.request("GET", path, verb="list", resource=resource, query=page_query)
            items.extend(page.get("items") or ())
            token = str((page.get("metadata") or {}).get("continue") or "")
            if not token:
                return items

    async def watch(
        self, kind: Resource, *, namespace: str = "", query: _Query, read_timeout: float
    ) -> AsyncIterator[Obj]:
        """Watch events of a collection (in ``namespace``, or all) as dicts, until the server
        ends the stream.

        ``read_timeout`` bounds the silence between two chunks, so a dead connection
        is noticed; bookmarks keep a healthy one talking. The stream holds one of the
        pool's connections for its whole life.
        """
        path, resource = kind.path(namespace=namespace), kind.rbac()
        try:
            # aclosing: a consumer that stops early closes the stream (and its slot) now.
            async with contextlib.aclosing(self._watch(path, resource, query, read_timeout)) as it:
                async for event in it:
                    yield event
        except ApiError as exc:
            self._errors[type(exc).__name__] += 1
            raise

    async def _watch(
        self, path: str, resource: str, query: _Query, read_timeout: float
    ) -> AsyncGenerator[Obj]:
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
        async with self._slots:
            try:
                response = await self._api.call_api(*params, _request_timeout=timeout)
            except ApiException as exc:
                raw = exc.body if isinstance(exc.body, bytes) else str(exc.body or "").encode()
                raise _failure(int(exc.status or 0), "watch", resource, raw) from exc
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                raise UnavailableError(
                    f"watch {resource}: no answer from the API server: {_text(exc)}",
                    status=0,
                    verb="watch",
                    resource=resource,
                ) from exc
            raw_response: aiohttp.ClientResponse = response.response
            try:
                if response.status != 200:
                    raise _failure(response.status, "watch", resource, await raw_response.read())
                async for event in _events(raw_response, resource):
                    yield event
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                raise UnavailableError(
                    f"watch {resource}: stream broke: {_text(exc)}",
                    status=0,
                    verb="watch",
                    resource=resource,
                ) from exc
            finally:
                # Close, not release: a half-read stream must not go back to the pool.
                raw_response.close()


def _text(exc: BaseException) -> str:
    """aiohttp's own words ("Cannot connect to host ..."); the class where there are none."""
    return str(exc) or type(exc).__name__


async def _events(raw: aiohttp.ClientResponse, resource: str) -> AsyncIterator[Obj]:
    buffer = b""
    # Lines can be long (a slice of 128 devices), so split them ourselves rather than
    # rely on the stream reader's line-length limit.
    async for chunk in raw.content.iter_any():
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError as exc:
                raise error_for(200, "watch", resource, f"an event is not JSON: {exc}") from exc
            if not isinstance(event, dict):
                raise error_for(200, "watch", resource, "an event is not a JSON object")
            if event.get("type") == "ERROR":
                status = event.get("object") or {}
                raise error_for(
                    int(status.get("code") or 500),
                    "watch",
                    resource,
                    str(status.get("message") or "watch error"),
                    status,
                )
            yield event
