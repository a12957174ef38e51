"""The IMEX config has NVIDIA's template's keys and values, with the two variables filled in;
nodes.cfg names every possible peer; the stand-in IMEX accepts what the daemon writes."""

from pathlib import Path

from cluster.imexdaemon.imexconfig import render_config, render_nodes, settings
from tests import imexstandin

# The template's keys in its order, with its values (facts §5.5), written out independently.
NVIDIA = {
    "LOG_LEVEL": "4",
    "LOG_FILE_NAME": "",
    "STATS_FILE_NAME": "/var/log/nvidia-imex-stats.log",
    "LOG_APPEND_TO_LOG": "0",
    "LOG_FILE_MAX_SIZE": "1024",
    "LOG_MAX_ROTATE_COUNT": "10",
    "LOG_USE_SYSLOG": "0",
    "DAEMONIZE": "0",
    "BIND_INTERFACE_IP": "",
    "SERVER_PORT": "50000",
    "IMEX_NODE_CONFIG_FILE": "{{ .IMEXDaemonNodesConfigPath }}",
    "NETWORK_INTERFACE": "",
    "IMEX_WAIT_FOR_QUORUM": "RECOVERY",
    "IMEX_ENABLE_AUTH_ENCRYPTION": "0",
    "IMEX_AUTH_ENCRYPTION_MODE": "SSL_TLS",
    "IMEX_AUTH_SOURCE": "",
    "IMEX_SERVER_KEY": "",
    "IMEX_SERVER_CERT": "",
    "IMEX_SERVER_CERT_AUTH": "",
    "IMEX_CLIENT_KEY": "",
    "IMEX_CLIENT_CERT": "",
    "IMEX_CLIENT_CERT_AUTH": "",
    "IMEX_SECURITY_TARGET_OVERRIDE": "",
    "IMEX_GSS_SERVICE_NAME": "host",
    "IMEX_GSS_TIMEOUT_SEC": "30",
    "IMEX_GSS_RETRY_INTERVAL_SEC": "5",
    "IMEX_GSS_SEC_CONTEXT_LIFETIME_SEC": "-1",
    "IMEX_GSS_SHUTDOWN_ON_FAILURE": "0",
    "IMEX_CMD_ENABLED": "1",
    "IMEX_CMD_BIND_INTERFACE_IP": "{{ .IMEXCmdBindInterfaceIP }}",
    "IMEX_CMD_PORT": "50005",
    "IMEX_CMD_UNIX_DOMAIN_PATH": "",
    "IMEX_NODE_DISCONNECTED_GRACE_TIME": "-1",
}


def test_the_keys_and_values_are_nvidias_templates() -> None:
    ours = dict(settings(cmd_bind_ip="10.1.2.3", nodes_config_path="/imexd/nodes.cfg"))
    assert list(ours) == list(NVIDIA)
    filled = {
        key: value.replace("{{ .IMEXDaemonNodesConfigPath }}", "/imexd/nodes.cfg").replace(
            "{{ .IMEXCmdBindInterfaceIP }}", "10.1.2.3"
        )
        for key, value in NVIDIA.items()
    }
    assert ours == filled


def test_the_rendered_file_is_key_value_lines(tmp_path: Path) -> None:
    text = render_config(cmd_bind_ip="10.1.2.3", nodes_config_path="/imexd/nodes.cfg")
    config = tmp_path / "imexd.cfg"
    config.write_text(text)
    assert imexstandin.read_config(str(config)) == dict(
        settings(cmd_bind_ip="10.1.2.3", nodes_config_path="/imexd/nodes.cfg")
    )
    imexstandin.validate(imexstandin.read_config(str(config)))  # the stand-in would start


def test_nodes_cfg_names_every_possible_peer() -> None:
    lines = render_nodes(18).splitlines()
    assert len(lines) == 18
    assert lines[0] == "compute-domain-daemon-0000"
    assert lines[-1] == "compute-domain-daemon-0017"
    assert render_nodes(1) == "compute-domain-daemon-0000\n"
