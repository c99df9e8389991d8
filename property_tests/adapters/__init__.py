"""Adapters: the contract's five operations of a concrete library, with its declarations.

Each adapter module imports its library lazily (at instantiation), so listing or
registering them costs nothing and a missing library is reported as "not installed".
"""
