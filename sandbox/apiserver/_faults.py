"""Fault injection and the request log, both safe to drive from another thread."""

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

# API groups whose name has no dot: only these tell a group from a core resource in a path.
_DOTLESS_GROUPS = frozenset({"apps"})


def _is_group(head: str) -> bool:
    return "." in head or head in _DOTLESS_GROUPS


VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


@dataclass(frozen=True)
class RequestRecord:
    """One request as the log keeps it; ``resource`` is ``group/plural[/subresource]``."""

    verb: str
    resource: str
    namespace: str | None
    name: str | None
    code: int
    user_agent: str
    dropped: bool = False  # the write committed but the response never reached the client
    dry_run: bool = False  # ?dryRun=All: checked and answered, nothing stored
    watch_list: bool = False  # a watch with sendInitialEvents: a list, then the stream


class RequestLog:
    """Every request the server answered, in order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[RequestRecord] = []

    def append(self, record: RequestRecord) -> None:
        with self._lock:
            self._records.append(record)

    def __iter__(self) -> Iterator[RequestRecord]:
        return iter(self.snapshot())

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)

    def snapshot(self) -> list[RequestRecord]:
        with self._lock:
            return list(self._records)

    def clear(self) -> None:
        with self._lock:
            self._records.clear()

    def count(
        self, verb: str | None = None, resource: str | None = None, name: str | None = None
    ) -> int:
        return sum(1 for r in self.snapshot() if _matches(r, verb, resource, name))

    def writes(self, resource: str | None = None) -> list[RequestRecord]:
        """Successful writes (what a publisher must keep to a minimum); dry runs store nothing."""
        return [
            r
            for r in self.snapshot()
            if r.verb in WRITE_VERBS
            and r.code < 400
            and not r.dry_run
            and _matches(r, None, resource, None)
        ]

    def permissions(self) -> set[tuple[str, str, str]]:
        """(API group, resource[/subresource], verb) of every resource request, for checking
        an RBAC role against what a component actually does; discovery is left out."""
        used = set()
        for r in self.snapshot():
            if r.resource.startswith("/"):
                continue
            head, _, rest = r.resource.partition("/")
            group, resource = (head, rest) if _is_group(head) else ("", r.resource)
            used.add((group, resource, r.verb))
        return used


def _resource_matches(actual: str, wanted: str) -> bool:
    """``resourceslices`` matches ``resource.k8s.io/resourceslices``; subresources are named."""
    if wanted in ("*", actual):
        return True
    head, _, rest = actual.partition("/")
    return _is_group(head) and wanted == rest


def _matches(r: RequestRecord, verb: str | None, resource: str | None, name: str | None) -> bool:
    if verb is not None and verb not in ("*", r.verb):
        return False
    if name is not None and name != r.name:
        return False
    return resource is None or _resource_matches(r.resource, resource)


@dataclass
class _Rule:
    verb: str
    resource: str
    name: str | None
    remaining: int  # negative: forever
    code: int = 0
    message: str = ""
    delay: float = 0.0
    retry_after: int | None = None

    def hits(self, verb: str, resource: str, name: str | None) -> bool:
        if self.verb not in ("*", verb):
            return False
        if self.name is not None and self.name != name:
            return False
        return self.resource == "*" or _resource_matches(resource, self.resource)


@dataclass(frozen=True)
class Injected:
    """What the server must do to one request."""

    delay: float = 0.0
    code: int = 0
    message: str = ""
    retry_after: int | None = None
    drop: str = ""  # "", "reset", "timeout" or "late": after the write commits
    forbidden_user: str = ""


class Faults:
    """Switches tests flip to make the server misbehave.

    Rules match on (verb, resource[, name]): verb is a Kubernetes verb or ``*``; resource is
    ``resourceslices``, ``resource.k8s.io/resourceslices``, ``resourceclaims/status`` or ``*``.
    """

    def __init__(self, *, serve_resource_v1: bool = True) -> None:
        self._lock = threading.Lock()
        self._serve_default = serve_resource_v1
        self._failures: list[_Rule] = []
        self._delays: list[_Rule] = []
        self._drops: list[tuple[_Rule, str]] = []
        self._forbidden: list[tuple[_Rule, str]] = []
        self.serve_resource_v1 = serve_resource_v1
        self.hold_seconds = 30.0
        self.late_seconds = 0.5
        self._drop_hook: Callable[[], None] | None = None

    def fail(
        self,
        verb: str,
        resource: str,
        name: str | None = None,
        *,
        code: int = 500,
        times: int = 1,
        message: str | None = None,
        retry_after: int | None = None,
    ) -> None:
        """The next ``times`` matching requests get ``code`` (times < 0: until cleared)."""
        with self._lock:
            self._failures.append(
                _Rule(
                    verb,
                    resource,
                    name,
                    times,
                    code,
                    message or f"injected fault: {code}",
                    retry_after=retry_after,
                )
            )

    def delay(
        self, verb: str, resource: str, name: str | None = None, *, seconds: float, times: int = -1
    ) -> None:
        """Add latency to matching requests."""
        with self._lock:
            self._delays.append(_Rule(verb, resource, name, times, delay=seconds))

    def drop_response(
        self,
        verb: str,
        resource: str,
        name: str | None = None,
        *,
        times: int = 1,
        mode: str = "reset",
    ) -> None:
        """Commit matching writes, then lose the response: ``reset`` closes the connection,
        ``timeout`` holds it open, unanswered, for ``hold_seconds`` (the client gives up first);
        or hold it back: ``late`` answers after ``late_seconds``, when the write's watch events
        have gone out (a real server promises no order between the two)."""
        if mode not in ("reset", "timeout", "late"):
            raise ValueError(f"mode must be 'reset', 'timeout' or 'late', not {mode!r}")
        with self._lock:
            self._drops.append((_Rule(verb, resource, name, times), mode))

    def forbid(
        self, verb: str, resource: str, *, user: str = "system:serviceaccount:default:default"
    ) -> None:
        """Answer 403, as RBAC would, for (verb, resource) until cleared."""
        with self._lock:
            self._forbidden.append((_Rule(verb, resource, None, -1), user))

    def clear(self) -> None:
        """Remove every rule; resource.k8s.io/v1 is served again if the version has it."""
        with self._lock:
            self._failures.clear()
            self._delays.clear()
            self._drops.clear()
            self._forbidden.clear()
            self.serve_resource_v1 = self._serve_default

    def drop_watches(self) -> None:
        """Close every open watch stream now (the server ends them cleanly)."""
        with self._lock:
            hook = self._drop_hook
        if hook is not None:
            hook()

    def set_drop_hook(self, hook: Callable[[], None] | None) -> None:
        with self._lock:
            self._drop_hook = hook

    def decide(self, verb: str, resource: str, name: str | None) -> Injected:
        with self._lock:
            delay = 0.0
            for rule in _take(self._delays, verb, resource, name):
                delay += rule.delay
            for rule, user in self._forbidden:
                if rule.hits(verb, resource, name):
                    return Injected(delay=delay, code=403, forbidden_user=user)
            failure = next(_take(self._failures, verb, resource, name, first=True), None)
            if failure is not None:
                return Injected(delay, failure.code, failure.message, failure.retry_after)
            drop = ""
            for rule, mode in self._drops:
                if rule.remaining != 0 and rule.hits(verb, resource, name):
                    rule.remaining -= 1
                    drop = mode
                    break
            self._drops = [(r, m) for r, m in self._drops if r.remaining != 0]
            return Injected(delay=delay, drop=drop)


def _take(
    rules: list[_Rule], verb: str, resource: str, name: str | None, first: bool = False
) -> Iterator[_Rule]:
    """Matching rules, each use counted; spent rules are removed."""
    hit: list[_Rule] = []
    for rule in rules:
        if rule.remaining != 0 and rule.hits(verb, resource, name):
            rule.remaining -= 1
            hit.append(rule)
            if first:
                break
    rules[:] = [r for r in rules if r.remaining != 0]
    return iter(hit)
