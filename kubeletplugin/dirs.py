"""The modes of the directories the plugin creates (with :func:`driver.common.fsutil.
ensure_dir`, which no umask widens: a container started with umask 000 would otherwise make the
plugin directory, the registry directory and the CDI root world-writable, and anyone on the
node could then replace a socket or a CDI spec).
"""

PRIVATE = 0o750  # the plugin's own state and sockets: root and the kubelet
CDI_ROOT = 0o755  # container runtimes and their hooks read the specs
