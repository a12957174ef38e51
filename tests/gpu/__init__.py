"""The real-GPU suite: ``make gpu-check``, never part of ``make test``."""
