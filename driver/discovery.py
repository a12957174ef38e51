"""Placeholder: filled in by the foundation work."""
