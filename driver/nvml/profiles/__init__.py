"""Simulated hardware profiles (YAML data, one file per instance type)."""
