"""A local Kubernetes API server for tests and the demo; never imported by the node daemon.

It serves, over real HTTP, the slice of the Kubernetes REST API this project uses (discovery,
CRUD, merge/JSON patch, list, watch with bookmarks and 410, DeleteCollection, garbage
collection of Node-owned objects) with the real server's validation, and lets a test inject
faults and read a log of every request.

Differences from the real server, on purpose: strategic merge patch is applied as a JSON merge
patch (every list this project patches is atomic, where the two agree); server-side apply,
``dryRun``, protobuf/CBOR, Table output and /openapi are not served (kubectl needs
``--validate=false`` to create objects); garbage collection runs synchronously inside the
owner's DELETE.
"""

from sandbox.apiserver._faults import Faults, RequestLog, RequestRecord
from sandbox.apiserver._server import LocalApiServer
from sandbox.apiserver._threaded import ThreadedApiServer

__all__ = ["Faults", "LocalApiServer", "RequestLog", "RequestRecord", "ThreadedApiServer"]
