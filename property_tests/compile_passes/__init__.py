"""The compile-pass kit: toy models and their cases, what is checked of a compiled step, opcheck of
the cache-update ops, and deliberately broken passes (docs/PASSES.md)."""
