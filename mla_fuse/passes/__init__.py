"""Inductor post-grad passes: one per file, ordered by ``pass_manager.PostGradPassManager``."""

from mla_fuse.passes.config import FusionConfig, OptimizationLevel
from mla_fuse.passes.pass_manager import PostGradPassManager

__all__ = ["FusionConfig", "OptimizationLevel", "PostGradPassManager"]
