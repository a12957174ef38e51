"""The ComputeDomain controller (``gpu-dra compute-domain-controller``): for each ComputeDomain,
its finalizer, the per-domain DaemonSet of IMEX daemons, the daemon and workload
ResourceClaimTemplates, and its status from the daemons.

NVIDIA's strings are ``drivers.computedomain.names``. Modules, from the bottom: ``objects``
(the desired objects of one domain; pure), ``status`` (its status from its cliques and daemon
pods; pure), ``plan`` (observed state in, the writes that bring it in line out; pure),
``metrics`` (domains by status, read from the controller's cache at scrape time) and
``controller`` (the asyncio shell: watches, the writes, leader election).
"""
