"""The GPU model: discovery, the inventory, the device kinds, health rules, slices."""
