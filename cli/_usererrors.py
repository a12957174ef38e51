"""User mistakes as one line: what went wrong and what to do, never a traceback.

Commands catch the errors they expect; :func:`one_line` is the net under all of them
in ``gpu-dra``'s ``main``, so a wrong kubeconfig, an unreachable API server or a
missing permission reads the same from every subcommand. Anything it does not
recognise is a bug of ours and keeps its traceback.
"""

from dataclasses import dataclass

EXIT_FAILURE = 1
EXIT_USAGE = 2


@dataclass(frozen=True, slots=True)
class Line:
    text: str
    exit_code: int


def _api_status(exc: BaseException) -> Line | None:
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", None)
    if not isinstance(status, int) or type(exc).__name__ != "ApiException":
        return None
    if status in (401, 403):
        what = "not authenticated" if status == 401 else "not allowed"
        return Line(
            f"the API server answered HTTP {status} ({reason}): {what}; check the kubeconfig's "
            "user and that its RBAC grants this command's reads (kubectl auth can-i)",
            EXIT_FAILURE,
        )
    return Line(f"the API server answered HTTP {status} ({reason})", EXIT_FAILURE)


def one_line(exc: BaseException) -> Line | None:
    """The one line for a user mistake, or None for anything else."""
    from driver.common.errors import DriverError

    if isinstance(exc, DriverError):
        return Line(str(exc), EXIT_FAILURE)
    # Checked by name: importing kubernetes and aiohttp here would slow down every command.
    names = {cls.__name__ for cls in type(exc).__mro__}
    if "ConfigException" in names:
        from driver.kube.client import kubeconfig_hint

        return Line(f"kubeconfig: {kubeconfig_hint(str(exc))}", EXIT_USAGE)
    api = _api_status(exc)
    if api is not None:
        return api
    if "ClientConnectorError" in names or "ServerDisconnectedError" in names:
        return Line(f"cannot reach the API server: {exc}", EXIT_FAILURE)
    if isinstance(exc, TimeoutError):
        return Line("the API server did not answer in time", EXIT_FAILURE)
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return Line(f"{exc.filename}: {exc.strerror}", EXIT_USAGE)
    return None
