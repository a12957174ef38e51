"""The one way to the API server: the configured client, raw calls, leases, backoff."""

from driver.kube import deferredinit

# Before any module of ours imports kubernetes: see deferredinit for why.
deferredinit.install()
