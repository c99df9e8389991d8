"""Inputs that once killed the process: each runs in a child interpreter.

An empty cos/sin table (P = 0) or a cache without a slot (0 blocks, or blocks of 0 entries)
made the kernels read or write outside their buffers: the process died with SIGSEGV
(rc 139 from a shell), taking pytest with it. Each case must now raise ``ValueError`` naming
the argument, through the public wrapper and through the custom op compiled graphs call.

All cases run in one child, which reports each outcome as it goes: a case that kills the
child is named by the last line it printed.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

CHILD = r'''
import json, sys, torch
from mla_fuse import ops

T, H, L, R, D = 3, 2, 8, 4, 8

def mla(P=16, NB=2, B=4):
    projection = torch.randn(T, L + R)
    return (torch.arange(T), torch.randn(T, H, R), projection[:, L:], projection[:, :L], torch.randn(P, R), False,
            torch.arange(T), torch.zeros(NB, B, L + R), "auto", torch.ones(1))

def flash(P=16, NB=2, B=4, Hkv=2):
    return (torch.arange(T), torch.randn(T, 2 * Hkv, D), torch.randn(T, Hkv, D), torch.randn(T, Hkv, D),
            torch.zeros(NB, B, Hkv, D), torch.zeros(NB, B, Hkv, D), torch.arange(T), torch.randn(P, R), True, "auto",
            torch.ones(1), torch.ones(1))

def rope(P=16):
    return torch.arange(T), torch.randn(T, H, D), torch.randn(T, 1, D), D, torch.randn(P, R), True

def unfused_mla(**sizes):
    _, _, k_pe, kv_c, _, _, slots, cache, dtype, scale = mla(**sizes)
    return kv_c, k_pe, cache, slots, dtype, scale

def unfused_flash(**sizes):
    _, _, key, value, key_cache, value_cache, slots, _, _, dtype, k_scale, v_scale = flash(**sizes)
    return key, value, key_cache, value_cache, slots, dtype, k_scale, v_scale

CASES = {  # name: (operation, arguments, the argument the error must name)
    "rotary_embedding, table with 0 rows": ("rotary_embedding", rope(P=0), "cos_sin_cache"),
    "fused MLA, table with 0 rows": ("concat_and_cache_mla_rope_fused", mla(P=0), "cos_sin_cache"),
    "fused MLA, cache with 0 blocks": ("concat_and_cache_mla_rope_fused", mla(NB=0), "kv_cache"),
    "fused MLA, blocks of 0 entries": ("concat_and_cache_mla_rope_fused", mla(B=0), "kv_cache"),
    "MLA cache write, cache with 0 blocks": ("concat_and_cache_mla", unfused_mla(NB=0), "kv_cache"),
    "fused flash, table with 0 rows": ("rope_and_reshape_and_cache_flash", flash(P=0), "cos_sin_cache"),
    "fused flash, caches with 0 blocks": ("rope_and_reshape_and_cache_flash", flash(NB=0), "key_cache"),
    "fused flash, 0 KV heads": ("rope_and_reshape_and_cache_flash", flash(Hkv=0), "key"),
    "flash cache write, caches with 0 blocks": ("reshape_and_cache_flash", unfused_flash(NB=0), "key_cache"),
}

for name, (operation, args, argument) in CASES.items():
    for entry, function in (("wrapper", getattr(ops, operation)), ("direct", getattr(torch.ops.mla_fuse, operation))):
        print(json.dumps({"case": name, "entry": entry, "started": True}), flush=True)
        try:
            function(*args)
            outcome = {"error": None}
        except Exception as error:
            outcome = {"error": type(error).__name__, "message": str(error)}
        print(json.dumps({"case": name, "entry": entry, "argument": argument, **outcome}), flush=True)
'''


def test_inputs_that_crashed_the_process_now_raise_a_value_error_naming_the_argument():
    child = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, cwd=ROOT, timeout=600)
    lines = [json.loads(line) for line in child.stdout.splitlines() if line.startswith("{")]
    last = lines[-1] if lines else {}
    assert child.returncode == 0, (f"the child died (rc {child.returncode}) during {last.get('case')!r} "
                                   f"({last.get('entry')}):\n{child.stderr[-3000:]}")
    outcomes = [line for line in lines if "started" not in line]
    assert len(outcomes) == 18
    wrong = [o for o in outcomes if o["error"] != "ValueError" or f"'{o['argument']}'" not in o["message"]]
    assert not wrong, "\n".join(f"{o['case']} ({o['entry']}): {o['error']}: {o.get('message')}" for o in wrong)
