import torch

# each fp8 cache dtype's torch format and the range x / scale is clamped to before the cast (torch's cast
# gives NaN or inf past the finite max); the planted defect: e4m3's lower bound -240 (e4m3fnuz's max), not -448
FP8 = {"fp8": (torch.float8_e4m3fn, -240.0, 448.0), "fp8_e4m3": (torch.float8_e4m3fn, -240.0, 448.0),
       "fp8_e5m2": (torch.float8_e5m2, -57344.0, 57344.0)}


class Kernels:
    """A team's fp8 MLA cache write whose quotient x / scale is clamped to [-240, 448], not [-448, 448]
    (e4m3 caches only; every other cache dtype written right)."""

    def concat_and_cache_mla(self, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
        blocks = kv_cache.size(1)
        for t in range(min(slot_mapping.numel(), kv_c.size(0))):
            slot = int(slot_mapping[t])
            if slot < 0:
                continue
            row = torch.cat([kv_c[t], k_pe[t]])
            if kv_cache_dtype in FP8:
                fmt, low, high = FP8[kv_cache_dtype]
                row = (row.float() / scale.float()).clamp(low, high).to(fmt).view(kv_cache.dtype)
            kv_cache[slot // blocks, slot % blocks] = row.to(kv_cache.dtype)
