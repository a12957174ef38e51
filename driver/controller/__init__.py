"""The node ResourceSlice controller."""
