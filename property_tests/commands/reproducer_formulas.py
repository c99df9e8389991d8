"""The text of a standalone reproducer (``reproducer.py`` fills it in): CONTRACT §1-§5 written out.

A script is ``HEADER``, the constants and inputs, the kernel call, ``MEMORY`` (each buffer rebuilt
between guard bytes, the arguments as the same views, the expected memory image), the helpers of
the one operation it calls (``rotate`` for rotating operations, ``store`` for cache writes, each
with only the pieces the case needs), that operation's formula (``FORMULAS``) and ``JUDGE`` (every
byte compared, the guards checked, the first differences named, the exit status). It imports only
torch and what the kernel call imports, so it runs where the kernel's maintainers work.
"""

from __future__ import annotations

from mla_fuse_conformance.declarations.operations import CACHING_OPERATIONS, FUSED_OPERATIONS, ROTATING_OPERATIONS

HEADER = '''#!/usr/bin/env python3
"""{title}
From {origin} (`mla-fuse verify`); needs only torch and the kernel's package. Exit 0: the arguments' buffers hold what
the formula in float64 gives (CONTRACT §5) and the guard bytes around them are unchanged; 1: what differs is printed; a
crash dies by its signal. `--reference` writes the formula's values instead of calling the kernel (exit 0)."""
import math, pathlib, sys  # noqa: E401
import torch
'''

TENSORS_HEAD = ("TENSORS = {  # argument: its buffer (dtype, data pointer mod 64, raw bits or \"pt\": in the .pt file "
                "beside\n    # this script) or the earlier argument whose buffer it shares; sizes, strides, storage offset")

DATA = 'DATA = torch.load(pathlib.Path(__file__).with_suffix(".pt"))  # the buffers marked "pt", as integers'

MEMORY = '''

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
'''

BOUNDS = '''exact, bound = ({name: torch.full(w.shape, fill, dtype=torch.float64) for name, w in want.items()} for fill in (0, -1))
'''

FP8_IMAGE = '''fp8 = {name: torch.zeros(w.shape, dtype=torch.bool) for name, w in want.items()}  # where the formula gives fp8 codes
'''

ROTATE = '''

def rotate(arg, rows, size):  # CONTRACT §1: pairs (a, b) of a head's first R -> (a*c - b*s, b*c + a*s)
    heads = lambda t: t.view(len(t), -1, size)  # noqa: E731 - [T, heads, size]
    x, table, f = heads(at(before, arg)).double(), at(before, "cos_sin_cache").double(), torch.finfo(args[arg].dtype)
    R, i = table.size(1), torch.arange(table.size(1) // 2)
    c, s = table[at(before, "positions").long()][:, None].split(R // 2, -1)
    first, second = (i, i + R // 2) if args["is_neox"] else (2 * i, 2 * i + 1)
    a, b, value, terms = x[..., first], x[..., second], x[..., :R].clone(), x[..., :R].clone()
    value[..., first], value[..., second] = a * c - b * s, b * c + a * s
    terms[..., first], terms[..., second] = (a * c).abs() + (b * s).abs(), (b * c).abs() + (a * s).abs()
    # §5: |got - exact| <= ulp_out(exact) + 2^-22 (|a*c| + |b*s|), + 2 u_out (|a*c| + |b*s|) per_op
    ulp = 2.0 ** ((torch.frexp(value.abs()).exponent - 1).double().clamp(min=math.log2(f.tiny)) + math.log2(f.eps))
    tol = (ulp + (2.0 ** -22 + f.eps * PER_OP) * terms).nan_to_num(0.0)  # a NaN value: NaN
    for image, values in ((want, value.to(args[arg].dtype)), (exact, value), (bound, tol)):
        heads(at(image, arg))[rows, ..., :R] = values[rows]
    return value, tol

'''

SLOTS = '''
slots = at(before, "slot_mapping").long()
written = torch.zeros(TOKENS, dtype=torch.bool)
written[:slots.numel()] = slots >= 0  # CONTRACT §2: slot < 0 and rows past slot_mapping write nothing
'''

# store(): the row's source bits, with the rotated value's bound (fused), or its fp8 code (CONTRACT §3)
STORE = '''

def store(cache, values, scale, dtype, columns=slice(None){tol}):  # CONTRACT §2: row t -> cache[s // B, s % B]
    s = slots[slots >= 0]  # s = slot_mapping[t]
    index, x = (s // args[cache].size(1), s % args[cache].size(1), ..., columns), values[written].to(dtype)
{body}'''

STORE_BITS = '''    at(want, cache)[index] = x  # the source bits
'''

STORE_BOUND = '''    at(want, cache)[index] = x  # the source bits; a rotated value within its bound
    if tol is not None:
        at(exact, cache)[index], at(bound, cache)[index] = values[written], tol[written]
'''

STORE_FP8 = '''    codes = (x.float() / scale).clamp(-FP8[1], FP8[1]).to(FP8[0])  # §3: rne_satfinite(float32(x) / scale)
    at(want, cache).view(torch.uint8)[index], at(fp8, cache)[index] = codes.view(torch.uint8), True
'''

# the rows rotated: q and k of every row, or as the implementation declares padded rows (CONTRACT §4)
ROWS = '''q_rows = written if PADDED_ROWS == "skipped" else torch.ones(TOKENS, dtype=torch.bool)
k_rows = torch.ones(TOKENS, dtype=torch.bool) if PADDED_ROWS == "rotated" else written
'''

FORMULAS = {
    "rotary_embedding": '''
for arg in ("query", "key") if args["key"] is not None else ("query",):
    rotate(arg, slice(None), args["head_size"])
''',
    "concat_and_cache_mla": '''
store("kv_cache", torch.cat([at(before, "kv_c"), at(before, "k_pe")], -1), at(before, "scale"), args["kv_c"].dtype)
''',
    "concat_and_cache_mla_rope_fused": '''
''' + ROWS + '''R, L, scale = args["k_pe"].size(1), args["kv_c"].size(1), at(before, "kv_cache_scale")
rotate("q_pe", q_rows, R)
k, tol = rotate("k_pe", k_rows, R)
store("kv_cache", at(before, "kv_c"), scale, args["kv_c"].dtype, slice(0, L))
store("kv_cache", k[:, 0], scale, args["k_pe"].dtype, slice(L, None), tol[:, 0])
''',
    "reshape_and_cache_flash": '''
store("key_cache", at(before, "key"), at(before, "k_scale").reshape(1, -1, 1), args["key"].dtype)
store("value_cache", at(before, "value"), at(before, "v_scale").reshape(1, -1, 1), args["value"].dtype)
''',
    "rope_and_reshape_and_cache_flash": '''
''' + ROWS + '''R, k_scale = args["cos_sin_cache"].size(1), at(before, "k_scale").reshape(1, -1, 1)
rotate("query", q_rows, args["query"].size(-1))
k, tol = rotate("key", k_rows, args["key"].size(-1))
store("key_cache", k, k_scale, args["key"].dtype, slice(0, R), tol)
store("key_cache", at(before, "key")[..., R:], k_scale, args["key"].dtype, slice(R, None))
store("value_cache", at(before, "value"), at(before, "v_scale").reshape(1, -1, 1), args["value"].dtype)
''',
}

JUDGE_START = '''
if "--reference" in sys.argv:  # the formula's values instead of the kernel's
    for name, (_, _, flat) in memory.items():
        flat.copy_(want[name])
else:
    kernel(**args)
failed = wrote = 0
for name, (base, start, flat) in memory.items():  # every bit as `want`, but (§5):
    got, ints, e = flat.cpu(), INTS[flat.element_size()], {e}
    ok = got.view(ints) == want[name].view(ints)
'''

JUDGE_BOUND = '''    rotated = bound[name] >= 0  # a rotated value: within its bound, NaN where exact is NaN
    ok[rotated] = ((got.double() - e).abs() <= bound[name])[rotated] | (got.isnan() & e.isnan())[rotated]
'''

JUDGE_FP8 = '''    if fp8[name].any():  # an fp8 code: as ordered integers at most one step from the formula's, NaN alike
        pair = [code.view(torch.uint8).long() for code in (got, want[name])]
        order, nan = [torch.where(c > 127, 128 - c, c) for c in pair], [c & 127 >= NAN_CODE for c in pair]
        ok[fp8[name]] = (((order[0] - order[1]).abs() <= 1) & (nan[0] == nan[1]))[fp8[name]]
'''

# the first five elements that differ, each named as an argument's element (the storage index where none holds it)
JUDGE_END = '''    views, ids = [arg for arg in owner if owner[arg] == name], {{name: torch.arange(got.numel())}}
    for i in (~ok).nonzero().reshape(-1)[:5].tolist():
        where = [f"{{a}}{{(at(ids, a) == i).nonzero()[0].tolist()}}" for a in views if (at(ids, a) == i).any()]
        print(f"{{(where or [f'{{name}} storage element {{i}}'])[0]}}: got {{got[i].item()!r}}, expected "
              f"{{want[name][i].item()!r}}"{bound_text})
    outside = {{"before the start": (base[:start] != 0xA5).sum().item(),
               "past the end": (base[start + flat.nbytes:] != 0xA5).sum().item()}}
    for where, count in ((where, count) for where, count in outside.items() if count):
        print(f"wrote {{count}} bytes {{where}} of {{'/'.join(views)}}'s storage{crash}")
    failed, wrote = failed + (~ok).sum().item(), wrote + sum(outside.values())
print(f"{{failed}} elements differ from the formula, {{wrote}} bytes written outside the arguments' buffers"
      if failed or wrote else "conforms to the formula")
sys.exit(1 if failed or wrote else 0)
'''

BOUND_TEXT = ''' + (f" (exact {e[i].item()!r}, bound {bound[name][i].item():.3g})" if rotated[i] else "")'''


def program(operation: str, fp8: bool, crash: str) -> str:
    """Everything after the kernel call: the inputs rebuilt, ``operation``'s formula, the judgement (with
    the fp8 code rule where the cache holds fp8 codes); ``crash``: what the suite's run died of, or ''."""
    rotating, caching = operation in ROTATING_OPERATIONS, operation in CACHING_OPERATIONS
    store = STORE_FP8 if fp8 else STORE_BOUND if operation in FUSED_OPERATIONS else STORE_BITS
    tol = ", tol=None" if operation in FUSED_OPERATIONS else ""
    crash_text = f" (the suite's run died by {crash})" if crash else ""
    return "".join([MEMORY, BOUNDS if rotating else "", FP8_IMAGE if fp8 else "", ROTATE if rotating else "",
                    SLOTS if caching else "", STORE.format(tol=tol, body=store) if caching else "",
                    FORMULAS[operation], JUDGE_START.format(e="exact[name]" if rotating else "None"), JUDGE_BOUND if rotating else "",
                    JUDGE_FP8 if fp8 else "",
                    JUDGE_END.format(bound_text=BOUND_TEXT if rotating else "", crash=crash_text)]).rstrip()
