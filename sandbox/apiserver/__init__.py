"""A local Kubernetes API server for tests and the demo; never imported by the node daemon.

It serves, over real HTTP, the slice of the Kubernetes REST API this project uses (discovery,
CRUD, merge/JSON patch, list, watch with bookmarks and 410, DeleteCollection, garbage
collection of Node-owned objects) with the real server's validation, and lets a test inject
faults and read a log of every request.

Feature gates: ``LocalApiServer(feature_gates={"DRADeviceTaints": False, ...})`` makes it drop
the ResourceSlice fields behind a gate that is off, silently, as the real server does (see
``_gates``); gates not named are on. ``dryRun=All`` is served on create and update.

Differences from the real server, on purpose: strategic merge patch is applied as a JSON merge
patch (every list this project patches is atomic, where the two agree); server-side apply,
``dryRun`` on patch and delete, protobuf/CBOR, Table output and /openapi are not served
(kubectl needs ``--validate=false`` to create objects); garbage collection runs synchronously
inside the owner's DELETE; a gated field is dropped on every write, also on an update of an
object that already used it (the real server keeps it there); the default gate set has every
gate on, where a real 1.34 or 1.35 server has the alpha gates (taints, counters, consumable
capacity, binding conditions) off. It checks what the e2e tier showed the real server refuses
and it once took (a DeviceClass name that is no DNS subdomain, a request count of 0, a CEL
selector that does not compile: our CEL compiles it, so its messages are ours, with the real
server's status 422); CEL this project cannot run (``.?``) is taken, as the real server would.
The watch-list stream (``sendInitialEvents`` with the ``k8s.io/initial-events-end`` bookmark
that client-go 0.35 informers wait for) is served.
"""

from sandbox.apiserver._faults import Faults, RequestLog, RequestRecord
from sandbox.apiserver._server import LocalApiServer
from sandbox.apiserver._threaded import ThreadedApiServer

__all__ = ["Faults", "LocalApiServer", "RequestLog", "RequestRecord", "ThreadedApiServer"]
