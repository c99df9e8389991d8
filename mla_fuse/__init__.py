"""mla_fuse: fused RoPE + paged KV-cache update for MLA/MHA, its compile pass, and their verification."""

__version__ = "0.1.0"
