"""The IMEX daemon of a ComputeDomain (``gpu-dra compute-domain-daemon``), one per node of a
domain, in the DaemonSet the ComputeDomain controller makes.

Modules, from the bottom: ``peers`` (the domain's peers, their names, the mapping and its
diff; pure), ``imexconfig`` (the IMEX config and ``nodes.cfg``; pure), ``hostsfile`` (our block
of the hosts file: a pure merge and its atomic write), ``process`` (``nvidia-imex``, supervised),
``sources`` (peer sources without an API server), ``check`` (the readiness probe), ``daemon``
(the whole, over any :class:`~cluster.imexdaemon.peers.PeerSource`).
"""
