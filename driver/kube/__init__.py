"""The one way to the API server: the configured client, raw calls, leases, backoff."""
