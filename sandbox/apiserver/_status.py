"""``Status`` failure objects shaped exactly as the real API server returns them."""

from typing import Any

from sandbox.apiserver._resources import ResourceType

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


class ApiError(Exception):
    """A request failure; ``body`` is the Status object sent to the client."""

    def __init__(
        self,
        code: int,
        message: str,
        reason: str | None = None,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.headers = headers or {}
        self.body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason if reason is not None else _REASONS.get(code, "Unknown"),
        }
        if details is not None:
            self.body["details"] = details
        self.body["code"] = code


def _details(rt: ResourceType, name: str | None) -> dict[str, Any]:
    details: dict[str, Any] = {}
    if name:
        details["name"] = name
    if rt.group:
        details["group"] = rt.group
    details["kind"] = rt.plural
    return details


def not_found(rt: ResourceType, name: str) -> ApiError:
    return ApiError(404, f'{rt.group_resource} "{name}" not found', details=_details(rt, name))


def already_exists(rt: ResourceType, name: str) -> ApiError:
    return ApiError(
        409, f'{rt.group_resource} "{name}" already exists', "AlreadyExists", _details(rt, name)
    )


def conflict(rt: ResourceType, name: str, why: str) -> ApiError:
    return ApiError(
        409,
        f'Operation cannot be fulfilled on {rt.group_resource} "{name}": {why}',
        "Conflict",
        _details(rt, name),
    )


MODIFIED = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


def invalid(rt: ResourceType, name: str, errors: list[tuple[str, str]]) -> ApiError:
    """422 from (field path, message) pairs, e.g. ("spec.driver", 'Invalid value: "x": ...')."""
    texts = [f"{field}: {message}" if field else message for field, message in errors]
    summary = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    causes = [
        {"reason": _cause_reason(message), "message": message, "field": field}
        for field, message in errors
    ]
    details = {"name": name, "group": rt.group, "kind": rt.kind, "causes": causes}
    if not rt.group:
        del details["group"]
    return ApiError(422, f'{rt.qualified_kind} "{name}" is invalid: {summary}', "Invalid", details)


def _cause_reason(message: str) -> str:
    for prefix, reason in (
        ("Required value", "FieldValueRequired"),
        ("Unsupported value", "FieldValueNotSupported"),
        ("Too many", "FieldValueTooMany"),
        ("Too long", "FieldValueTooLong"),
        ("Duplicate value", "FieldValueDuplicate"),
        ("Forbidden", "FieldValueForbidden"),
    ):
        if message.startswith(prefix):
            return reason
    return "FieldValueInvalid"


def expired(message: str) -> ApiError:
    return ApiError(410, message, "Expired")


def forbidden(
    rt: ResourceType, verb: str, namespace: str | None, name: str | None, user: str
) -> ApiError:
    scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
    group = rt.group
    message = (
        f"{rt.group_resource}{' ' + repr_name(name) if name else ''} is forbidden: "
        f'User "{user}" cannot {verb} resource "{rt.plural}" in API group "{group}" {scope}'
    )
    return ApiError(403, message, details=_details(rt, name))


def repr_name(name: str) -> str:
    return f'"{name}"'


def not_served() -> ApiError:
    return ApiError(404, "the server could not find the requested resource", details={})
