"""Hypothesis settings of the suite: its profiles and its example database. Imports nothing else of the suite."""
