"""What the suite declares once: the contract's operations and dtypes, and the property modules.

The bottom layer of the suite: plain tuples and dicts of names, no torch, imports nothing of ours,
so every other layer (cases included) can read them. Tables keyed by operation or dtype elsewhere
are derived from these or checked against them.
"""
