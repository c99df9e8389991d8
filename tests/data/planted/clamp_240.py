import torch


class Kernels:
    """A team's fp8 MLA cache write whose quotient x / scale is clamped to [-240, 448], not [-448, 448]."""

    def concat_and_cache_mla(self, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
        blocks = kv_cache.size(1)
        for t in range(min(slot_mapping.numel(), kv_c.size(0))):
            slot = int(slot_mapping[t])
            if slot < 0:
                continue
            row = torch.cat([kv_c[t], k_pe[t]])
            if kv_cache_dtype != "auto":
                row = (row.float() / scale.float()).clamp(-240.0, 448.0).to(torch.float8_e4m3fn)
            kv_cache[slot // blocks, slot % blocks] = row.view(kv_cache.dtype)
