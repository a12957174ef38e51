"""The node drivers, one home each."""
