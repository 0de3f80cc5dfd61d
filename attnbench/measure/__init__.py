"""Measuring: time, memory, FLOPs."""
