"""The two files ``nvidia-imex`` reads at start: its config and its static ``nodes.cfg``.

Pure: text from data. The keys and values are those of NVIDIA's template
(``templates/compute-domain-daemon-config.tmpl.cfg``), whose only variables are the node
config path and the command service's bind address (the pod's IP). NVIDIA's kubelet plugin
copies that template into the domain's directory for the daemon to render; here the daemon
renders from this module, so no template file has to travel with the node driver.
"""

from collections.abc import Sequence

from drivers.computedomain import names

CONFIG_NAME = "imexd.cfg"
NODES_NAME = "nodes.cfg"
SERVER_PORT = 50000  # peer connections
CMD_PORT = 50005  # the command service nvidia-imex-ctl asks


def settings(*, cmd_bind_ip: str, nodes_config_path: str) -> tuple[tuple[str, str], ...]:
    """Every key of the config, in the template's order."""
    return (
        # Logs to stderr (an empty file name), which the pod's log collects.
        ("LOG_LEVEL", "4"),
        ("LOG_FILE_NAME", ""),
        ("STATS_FILE_NAME", "/var/log/nvidia-imex-stats.log"),
        ("LOG_APPEND_TO_LOG", "0"),
        ("LOG_FILE_MAX_SIZE", "1024"),
        ("LOG_MAX_ROTATE_COUNT", "10"),
        ("LOG_USE_SYSLOG", "0"),
        # In the foreground, so the daemon supervises the process itself.
        ("DAEMONIZE", "0"),
        ("BIND_INTERFACE_IP", ""),
        ("SERVER_PORT", str(SERVER_PORT)),
        ("IMEX_NODE_CONFIG_FILE", nodes_config_path),
        ("NETWORK_INTERFACE", ""),
        ("IMEX_WAIT_FOR_QUORUM", "RECOVERY"),
        ("IMEX_ENABLE_AUTH_ENCRYPTION", "0"),
        ("IMEX_AUTH_ENCRYPTION_MODE", "SSL_TLS"),
        ("IMEX_AUTH_SOURCE", ""),
        ("IMEX_SERVER_KEY", ""),
        ("IMEX_SERVER_CERT", ""),
        ("IMEX_SERVER_CERT_AUTH", ""),
        ("IMEX_CLIENT_KEY", ""),
        ("IMEX_CLIENT_CERT", ""),
        ("IMEX_CLIENT_CERT_AUTH", ""),
        ("IMEX_SECURITY_TARGET_OVERRIDE", ""),
        ("IMEX_GSS_SERVICE_NAME", "host"),
        ("IMEX_GSS_TIMEOUT_SEC", "30"),
        ("IMEX_GSS_RETRY_INTERVAL_SEC", "5"),
        ("IMEX_GSS_SEC_CONTEXT_LIFETIME_SEC", "-1"),
        ("IMEX_GSS_SHUTDOWN_ON_FAILURE", "0"),
        # The command service, on the pod's address: what the readiness check asks.
        ("IMEX_CMD_ENABLED", "1"),
        ("IMEX_CMD_BIND_INTERFACE_IP", cmd_bind_ip),
        ("IMEX_CMD_PORT", str(CMD_PORT)),
        ("IMEX_CMD_UNIX_DOMAIN_PATH", ""),
        # Never clean up a disconnected peer's imports on a timer: it may come back.
        ("IMEX_NODE_DISCONNECTED_GRACE_TIME", "-1"),
    )


def render_config(*, cmd_bind_ip: str, nodes_config_path: str) -> str:
    """The config file's text: ``KEY=value`` lines under one header comment."""
    lines = ["# nvidia-imex configuration, written by gpu-dra compute-domain-daemon."]
    lines += [
        f"{key}={value}"
        for key, value in settings(cmd_bind_ip=cmd_bind_ip, nodes_config_path=nodes_config_path)
    ]
    return "\n".join(lines) + "\n"


def node_names(max_nodes: int) -> Sequence[str]:
    return [names.daemon_dns_name(i) for i in range(max_nodes)]


def render_nodes(max_nodes: int) -> str:
    """One name per possible peer; the hosts file says which of them exist now, so this file
    never changes while the daemon runs (IMEX reads it at start and on SIGUSR1)."""
    return "".join(f"{name}\n" for name in node_names(max_nodes))
