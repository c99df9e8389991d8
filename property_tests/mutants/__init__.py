"""Deliberately broken implementations (kernels) and compile passes, usable as implementations (--impl mutant:NAME) and as the suite's self-test."""
