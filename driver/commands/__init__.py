"""Subcommands of ``gpu-dra`` that live in the driver layer.

Each module exposes ``register(subparsers)``; the parser it adds sets
``func`` to a callable taking the parsed namespace and returning an exit code.
Heavy imports happen inside that callable so ``gpu-dra --help`` stays fast.
"""
