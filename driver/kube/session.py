"""A connection to one API server: the ``kubernetes.aio`` client plus what every call on it shares.

A :class:`Session` is the package's ``ApiClient`` (server address, TLS, bearer tokens, user
agent; built by :mod:`driver.kube.client`) with two things of ours that belong to the
connection and not to a caller: one slot per connection of its pool, which every
:class:`driver.kube.rest.Client` on it waits for before a call's budget starts, and the count
of failed calls by error class, which the metrics read. It writes request bodies compactly
(:class:`_CompactTransport`) without changing the package for anyone else in the process.
"""

import asyncio
import collections
import json
import types
from collections.abc import Callable
from typing import Any, Self, TypeVar

from kubernetes.aio.client import ApiClient, Configuration
from kubernetes.aio.client import rest as _rest

_DEFAULT_POOL = 100  # kubernetes.aio's default connection_pool_maxsize
_F = TypeVar("_F", bound=Callable[..., Any])


class _CompactJson:
    """``json`` as the transport's request code sees it: compact, as Go clients and kubectl send.

    The API server keeps a RawExtension (an opaque config's ``parameters``) as the bytes it
    received, and on an update or a patch compares the immutable spec of a ResourceClaimTemplate
    byte for byte with its own compact re-encoding. With ``json.dumps``'s default separators (a
    space after each), a template our controller created could never be patched again: its
    finalizer could not be removed and the domain's deletion hung (seen on kube-apiserver 1.36:
    "spec: field is immutable" for a patch of metadata alone).
    """

    loads = staticmethod(json.loads)

    @staticmethod
    def dumps(obj: object) -> str:
        return json.dumps(obj, separators=(",", ":"))


def _with_globals(function: _F, **names: object) -> _F:
    """``function``'s own code run with some of its module's names replaced."""
    rebound = types.FunctionType(
        function.__code__,
        {**function.__globals__, **names},
        function.__name__,
        function.__defaults__,
        function.__closure__,
    )
    rebound.__kwdefaults__ = function.__kwdefaults__
    rebound.__qualname__ = function.__qualname__
    return rebound  # type: ignore[return-value]  # same signature as function


class _CompactTransport(_rest.RESTClientObject):
    """The package's transport, whose ``request`` serializes a body with :class:`_CompactJson`.

    The package encodes every JSON body with its rest module's ``json.dumps`` and offers no
    per-client hook; the same ``request`` code, given ``json`` of ours, is one without patching
    that module for every client in the process.
    """

    request = _with_globals(_rest.RESTClientObject.request, json=_CompactJson)


class Session(ApiClient):
    """An ``ApiClient`` with its pool's slots and its failed calls by error class."""

    def __init__(self, configuration: Configuration | None = None) -> None:
        super().__init__(configuration)
        # The transport ApiClient made, given our request code (it adds no state, and making
        # another would load the system's CA bundle again: 20 ms).
        self.rest_client.__class__ = _CompactTransport
        size = getattr(self.configuration, "connection_pool_maxsize", None) or _DEFAULT_POOL
        self.slots = asyncio.Semaphore(int(size))
        # By class name: a fixed set (driver.kube.rest.ERROR_CLASSES), for the metrics.
        self.errors: collections.Counter[str] = collections.Counter()

    async def __aenter__(self) -> Self:
        return self
