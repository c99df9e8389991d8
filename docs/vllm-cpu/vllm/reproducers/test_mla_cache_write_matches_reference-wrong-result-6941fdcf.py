#!/usr/bin/env python3
"""concat_and_cache_mla: wrong result on a slot past the first block written: yes; kv_cache block stride == block_size x entry stride: no (test_mla:test_mla_cache_write_matches_reference)
From test_mla_cache_write_matches_reference-vllm-c6b4c7a189.json (`mla-fuse verify`); needs only torch and the
kernel's package. Exit 0: the buffers hold the float64 formula's values (CONTRACT §5), their guard bytes intact; 1:
what differs is printed; a crash dies by its signal. `--reference` judges the formula's own values."""
import math, pathlib, sys, torch  # noqa: E401

DEVICE, TOKENS = 'cpu', 1
TENSORS = {  # argument: its buffer (dtype, address % 64, bits or "pt": in .pt) or the argument sharing it; sizes, strides, offset
    'kv_c': ((torch.bfloat16, 0, [-16704]), (1, 1), (1, 1), 0),
    'k_pe': ((torch.bfloat16, 0, [16163, 15885]), (1, 2), (2, 1), 0),
    'kv_cache': ((torch.bfloat16, 0, [8555, -24282, 21841, -6329, -24258, 27784, 22858, 16834, -13928, -13775, 19251, -22247]), (3, 1, 3), (4, 12, 1), 0),
    'slot_mapping': ((torch.int64, 0, [1, 2, 2, 2, 0]), (1,), (1,), 0),
    'scale': ((torch.float32, 0, [1065353216, -1565803179]), (1,), (1,), 0),
}
ARGS = {'kv_cache_dtype': 'auto'}

def kernel(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
    import importlib.util, pathlib
    torch.ops.load_library(str(pathlib.Path(importlib.util.find_spec("vllm").submodule_search_locations[0]) / '_C.abi3.so'))
    torch.ops._C.concat_and_cache_mla_cpu(kv_c, k_pe, kv_cache, slot_mapping)  # no kv_cache_dtype, scale

# Each buffer at its alignment mod 64 between guards of 0xA5 bytes as large as it plus the largest argument laid out
# contiguously (where a kernel that ignores strides writes); the arguments as the same views; `want`: bits expected.
INTS, owner, memory, args = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}, {}, {}, dict(ARGS)
for arg, (buffer, size, stride, offset) in TENSORS.items():
    owner[arg] = buffer if isinstance(buffer, str) else arg
    if owner[arg] == arg:
        dtype, align, bits = buffer
        data = (DATA[arg] if bits == "pt" else torch.tensor(bits, dtype=INTS[dtype.itemsize])).view(torch.uint8)
        guard = data.numel() + max(math.prod(t[1]) for t in TENSORS.values()) * dtype.itemsize
        base = torch.full((2 * guard + data.numel() + 64,), 0xA5, dtype=torch.uint8, device=DEVICE)
        start = guard + (align - base.data_ptr() - guard) % 64
        memory[arg] = (base, start, base[start:start + data.numel()].copy_(data).view(dtype))
    flat = memory[owner[arg]][2]
    args[arg] = torch.as_strided(flat, size, stride, flat.storage_offset() + offset)
before, want = ({name: flat.cpu().clone() for name, (_, _, flat) in memory.items()} for _ in range(2))
at = lambda image, arg: torch.as_strided(image[owner[arg]], *TENSORS[arg][1:])  # noqa: E731 - arg's view of an image

slots = at(before, "slot_mapping").long()  # CONTRACT §2: slot < 0 and rows past slot_mapping write nothing
written = torch.nn.functional.pad(slots >= 0, (0, TOKENS - len(slots)))

def store(cache, source, columns):  # §2: row t of source -> cache[s // B, s % B], s = slot_mapping[t]
    s = slots[slots >= 0]
    index = (s // args[cache].size(1), s % args[cache].size(1), ..., columns)
    at(want, cache)[index] = at(want, source)[written]  # the source bits

store("kv_cache", "kv_c", slice(0, args["kv_c"].size(1)))
store("kv_cache", "k_pe", slice(args["kv_c"].size(1), None))

if "--reference" not in sys.argv:  # --reference: the formula's values stand in for the kernel's
    kernel(**args)
failed = wrote = 0
for name, (base, start, flat) in memory.items():  # every bit as `want`
    got, ints = want[name] if "--reference" in sys.argv else flat.cpu(), INTS[flat.element_size()]
    ok, worse = got.view(ints) == want[name].view(ints), torch.zeros(got.shape, dtype=torch.float64)  # worse: order
    views, ids, bad = [arg for arg in owner if owner[arg] == name], {name: torch.arange(got.numel())}, (~ok).nonzero()
    for i in bad.reshape(-1)[torch.sort(-worse[bad.reshape(-1)], stable=True).indices][:5].tolist():
        where = [f"{a}{(at(ids, a) == i).nonzero()[0].tolist()}" for a in views if (at(ids, a) == i).any()]
        print(f"{(where or [f'{name} storage element {i}'])[0]}: got {got[i].item()!r}, expected {want[name][i].item()!r}")
    for where, guard in (("before the start", base[:start]), ("past the end", base[start + flat.nbytes:])):
        if (count := (guard != 0xA5).sum().item()):
            print(f"wrote {count} bytes {where} of {'/'.join(views)}'s storage")
        wrote += count
    failed += (~ok).sum().item()
print(f"{failed} elements differ from the formula" if failed else "every element conforms to the formula")
sys.exit(1 if failed or wrote else 0)
