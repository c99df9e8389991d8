"""Judging an example: the float64 oracle's expectation, the comparisons under CONTRACT §5, and opcheck of the compile path's update ops."""
