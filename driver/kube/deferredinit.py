"""The kubernetes package's transport without the rest of the package.

Every call of ours is raw JSON through ``kubernetes.aio.client``'s ``ApiClient``,
``Configuration`` and ``RESTClientObject`` (whose own ``__init__`` loads its APIs and
models lazily). But Python runs a package's ``__init__`` before any of its modules,
and the two above them load everything: ``kubernetes/__init__.py`` the synchronous
client, its kubeconfig loader (``requests``, ``oauthlib``, ``google-auth``), ``dynamic``,
``stream`` (``websocket``), ``watch``, ``informer`` and ``leaderelection``;
``kubernetes/aio/__init__.py`` the same of the aio half. That is about two thirds of
the node daemon's import time and 20 MiB of its memory, none of it used.

:func:`install` registers ``kubernetes`` and ``kubernetes.aio`` as the packages they
are (same spec, same ``__path__``) with their ``__init__`` not yet run; it runs, in
the same module object, the first time anything reads an attribute the package does
not have yet (``kubernetes.__version__``, ``from kubernetes import client``,
``kubernetes.aio.config`` before it was imported). Importing a submodule by its full
name (``from kubernetes.aio.client import ApiClient``) needs no attribute of its
parents, so it leaves them deferred. Nothing changes for code that uses the package
in any other way: it only pays for the ``__init__`` when it needs it.

Installed by :mod:`driver.kube`'s ``__init__``, which runs before any module of ours
imports ``kubernetes``; a process that imported ``kubernetes`` before it keeps the
package as it is.
"""

import importlib.util
import sys
import threading
from types import ModuleType

PACKAGES = ("kubernetes", "kubernetes.aio")

# The deferred __init__ of a package may run from two threads at once (asyncio.to_thread).
_lock = threading.RLock()


def install() -> None:
    """Register the packages above the transport, their ``__init__`` deferred."""
    with _lock:
        for name in PACKAGES:
            if name in sys.modules:
                return  # already imported the usual way (or installed): leave it so
            spec = importlib.util.find_spec(name)
            if spec is None or spec.loader is None or spec.submodule_search_locations is None:
                return  # not an ordinary package: let the import system do as it does
            module = importlib.util.module_from_spec(spec)
            vars(module)["__getattr__"] = _runs_init(module)
            sys.modules[name] = module
            parent, _, child = name.rpartition(".")
            if parent:
                setattr(sys.modules[parent], child, module)


def deferred(name: str) -> bool:
    """Whether package ``name``'s ``__init__`` has not run yet (for tests and benches)."""
    module = sys.modules.get(name)
    return module is not None and "__getattr__" in vars(module) and _is_ours(module)


def _is_ours(module: ModuleType) -> bool:
    return getattr(vars(module)["__getattr__"], "_deferred_init", False) is True


def _runs_init(module: ModuleType) -> object:
    def __getattr__(attribute: str) -> object:
        with _lock:
            if vars(module).get("__getattr__") is __getattr__:
                del vars(module)["__getattr__"]
                spec = module.__spec__
                assert spec is not None and spec.loader is not None
                spec.loader.exec_module(module)
        try:
            return vars(module)[attribute]
        except KeyError:
            # The package's own __getattr__ (if its __init__ defines one), else the error
            # the import system expects ("from package import name" falls back on it).
            fallback = vars(module).get("__getattr__")
            if callable(fallback):
                return fallback(attribute)
            raise AttributeError(
                f"module {module.__name__!r} has no attribute {attribute!r}"
            ) from None

    vars(__getattr__)["_deferred_init"] = True
    return __getattr__
