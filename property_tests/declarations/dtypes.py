"""The dtypes of the contract, by name (CONTRACT §1-§4), declared once for the whole suite.

Names, not torch dtypes: this module imports nothing (``cases.tensors.DTYPES`` maps names to
torch dtypes). Taken from docs/CONTRACT.md, never from the product, so the suite states the
contract independently of what ``mla_fuse`` accepts. Orders matter: strategies sample from the
front first when they shrink.
"""

from __future__ import annotations

# Activations (q, k, v, kv_c) and cos/sin tables.
FLOAT_DTYPES = ("float32", "bfloat16", "float16")
# positions and slot_mapping (CONTRACT §2; docs/DESIGN.md "Shapes accepted").
INDEX_DTYPES = ("int64", "int32")
# fp8 formats (CONTRACT §3): format -> finite max.
FP8_FORMATS = {"e4m3": 448.0, "e5m2": 57344.0}
# kv_cache_dtype -> the fp8 format it stores (CONTRACT §3 table).
FP8_FORMAT_OF_KV_CACHE_DTYPE = {"fp8": "e4m3", "fp8_e4m3": "e4m3", "fp8_e5m2": "e5m2"}
FP8_CACHE_DTYPES = tuple(FP8_FORMAT_OF_KV_CACHE_DTYPE)
# Every kv_cache_dtype: "auto" and the named float dtypes store the source bits, the rest fp8 codes.
KV_CACHE_DTYPES = ("auto", *FLOAT_DTYPES, *FP8_CACHE_DTYPES)
# How an fp8 cache tensor may be held (CONTRACT §3): torch.uint8 bit patterns or torch.float8_*.
FP8_STORAGES = ("uint8", "float8")
