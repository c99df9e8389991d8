"""Liger-Kernel's rope through ``--impl liger`` (``property_tests/adapters/liger.py``; docs/THIRD_PARTY.md is
the report).

Fixed cases against CONTRACT §5's bound; the declared limits; and, under Triton's interpreter, the bfloat16
corrections of ``corrected_interpreter`` (``running/interpreter_corrections.py``): on planted values the
interpreter truncates fp32 -> bf16 and computes bf16 arithmetic on bit patterns, the corrected one rounds
to nearest even as a GPU does, a kernel that itself truncates still truncates (no false pass), and Liger
needs the correction (no false failure). A few seconds under the interpreter.

Where Liger-Kernel comes from: ``$MLA_FUSE_LIGER_PATH`` (a directory an unpacked liger-kernel wheel was
unzipped into), else the installed package, else ``$MLA_FUSE_LIGER_WHEEL`` (a wheel file, unzipped here into
a temporary directory); otherwise skipped, and under CI=true failed (.ci/run downloads the wheel).
"""

from __future__ import annotations


import pytest
import torch
import triton.language as tl

from mla_fuse.kernels import INTERPRETED
from mla_fuse_conformance.judging.comparisons import rope_bound, rotation_terms
from mla_fuse_reference.rope import rope_exact
from third_party_helpers import DEVICE, TIE_BREAKER, adapter_loader, bf16_tie_case, randn, rope_table

PATH_ENV_VAR, WHEEL_ENV_VAR = "MLA_FUSE_LIGER_PATH", "MLA_FUSE_LIGER_WHEEL"
INTERPRETER_ONLY = pytest.mark.skipif(not INTERPRETED, reason="the bf16 corrections apply under the interpreter only")


@pytest.fixture(scope="module")
def liger_root(third_party_root):
    """The directory ``${PATH_ENV_VAR}`` is to name (None: the installed package)."""
    return third_party_root("liger_kernel", PATH_ENV_VAR, WHEEL_ENV_VAR, "Liger-Kernel", "liger-kernel==0.8.5")


@pytest.fixture
def liger(liger_root, monkeypatch):
    """A loader of the adapter: ``liger(source=None, **attributes)``."""
    from mla_fuse_conformance.adapters.liger import LigerImplementation

    return adapter_loader(LigerImplementation, liger_root, PATH_ENV_VAR, monkeypatch)






def _outside_bound(got, before, positions, table, head_size):
    """How many rotated elements of ``got`` lie outside CONTRACT §5's ``per_op`` bound (Liger's declaration)."""
    got, before = got.reshape(got.size(0), -1, head_size), before.reshape(before.size(0), -1, head_size)
    rotary_dim = table.size(1)
    exact = rope_exact(positions, before, table, True)[..., :rotary_dim]
    bound = rope_bound(exact, rotation_terms(positions, before[..., :rotary_dim], table, True), got.dtype, "per_op")
    return int(((got[..., :rotary_dim].double() - exact).abs() > bound).sum())


@pytest.mark.parametrize("dtype, table_dtype, heads, kv_heads, head_size, rotary_dim, rank, strided", [
    (torch.bfloat16, torch.float32, 4, 2, 64, 64, 3, False),  # fp32 arithmetic, one rounding on store
    (torch.bfloat16, torch.bfloat16, 4, 2, 64, 64, 3, False),  # bf16 arithmetic (the interpreter's correction)
    (torch.float16, torch.float16, 3, 1, 128, 48, 3, True),  # partial rotary; a copy the glue writes back
    (torch.float32, torch.float32, 2, 2, 80, 80, 2, False),  # [T, H * D]
])
def test_fixed_cases_within_the_contracts_bound(liger, dtype, table_dtype, heads, kv_heads, head_size, rotary_dim,
                                                rank, strided):
    impl = liger()
    tokens = 5
    parent = randn(tokens, heads, head_size + (8 if strided else 0), dtype=dtype, seed=1)
    query = parent[..., :head_size] if strided else parent
    key = randn(tokens, kv_heads, head_size, dtype=dtype, seed=2)
    if rank == 2:
        query, key = query.reshape(tokens, -1), key.reshape(tokens, -1)
    table = rope_table(rotary_dim, table_dtype)
    positions = torch.tensor([0, 31, 7, 7, 12], device=DEVICE)
    parent_in, query_in, key_in = parent.clone(), query.clone(), key.clone()
    impl.rotary_embedding(positions, query, key, head_size, table, True)
    for name, got, before in (("query", query, query_in), ("key", key, key_in)):
        tail = got.reshape(tokens, -1, head_size)[..., rotary_dim:]
        assert torch.equal(tail, before.reshape(tokens, -1, head_size)[..., rotary_dim:]), f"{name}: tail changed"
        assert _outside_bound(got, before, positions, table, head_size) == 0, f"{name}: past the bound"
    if strided:
        assert torch.equal(parent[..., head_size:], parent_in[..., head_size:]), "written outside the view"


def test_the_declared_limits_and_the_glues_refusal(liger):
    impl = liger()
    assert impl.capabilities["rotary_embedding"].describe(True) == ["style: not gptj", "key: not none"]
    assert impl.rounding == "per_op"
    query = randn(2, 1, 8, dtype=torch.float32, seed=3)
    with pytest.raises(ValueError, match="is_neox=False"):
        impl.rotary_embedding(torch.tensor([0, 1], device=DEVICE), query, query.clone(), 8, rope_table(8, torch.float32),
                              False)


def _interpreted(fn):
    from triton.runtime.interpreter import InterpretedFunction

    return InterpretedFunction(fn)


def _copy(src, dst, n: tl.constexpr):
    tl.store(dst + tl.arange(0, n), tl.load(src + tl.arange(0, n)))


def _copy_truncating(src, dst, n: tl.constexpr):
    tl.store(dst + tl.arange(0, n), tl.load(src + tl.arange(0, n)).to(tl.bfloat16, fp_downcast_rounding="rtz"))


def _arithmetic(x, y, out, n: tl.constexpr):
    a, b = tl.load(x + tl.arange(0, n)), tl.load(y + tl.arange(0, n))
    tl.store(out + tl.arange(0, n), -(a * b - b) + a)


def _run(kernel, exact, *args):
    from mla_fuse_conformance.running.interpreter_corrections import corrected_interpreter, uncorrected_interpreter

    with corrected_interpreter() if exact else uncorrected_interpreter():
        kernel[(1,)](*args)


@INTERPRETER_ONLY
@pytest.mark.parametrize("source_dtype", [torch.float32, torch.float16])
def test_the_interpreter_truncates_to_bf16_and_the_correction_rounds_to_nearest_even(source_dtype):
    values = torch.tensor([TIE_BREAKER, -TIE_BREAKER, 1.0, 3.0], dtype=source_dtype)
    stored = {}
    for exact in (False, True):
        out = torch.empty(4, dtype=torch.bfloat16)
        _run(_interpreted(_copy), exact, values, out, 4)
        stored[exact] = out.float().tolist()
    assert stored[False] == [1.0, -1.0, 1.0, 3.0], f"the interpreter no longer truncates: {stored[False]}"
    assert stored[True] == [1.0078125, -1.0078125, 1.0, 3.0] == values.to(torch.bfloat16).float().tolist()


@INTERPRETER_ONLY
def test_a_kernel_that_truncates_still_truncates_under_the_correction():
    out = torch.empty(2, dtype=torch.bfloat16)
    _run(_interpreted(_copy_truncating), True, torch.tensor([TIE_BREAKER, -TIE_BREAKER]), out, 2)
    assert out.float().tolist() == [1.0, -1.0]


@INTERPRETER_ONLY
def test_bf16_arithmetic_runs_on_bit_patterns_and_the_correction_on_values():
    x, y = randn(64, dtype=torch.bfloat16, seed=4), randn(64, dtype=torch.bfloat16, seed=5)
    want = -(x * y - y) + x  # torch: each operation on the values, rounded to nearest even
    results = {}
    for exact in (False, True):
        out = torch.empty_like(x)
        _run(_interpreted(_arithmetic), exact, x, y, out, 64)
        results[exact] = out
    assert (results[False] != want).sum() > 32, "the interpreter now computes bf16 on values: is triton#10919 fixed?"
    assert torch.equal(results[True].view(torch.int16), want.view(torch.int16))




@INTERPRETER_ONLY
def test_liger_needs_the_correction_and_it_hides_no_truncating_kernel(liger):
    from mla_fuse_conformance.adapters.liger import ROPE_FILE, package_dir

    firsts = {}
    for exact in (False, True):
        positions, query, key, table = bf16_tie_case()
        liger(exact_bf16=exact).rotary_embedding(positions, query, key, 2, table, True)
        firsts[exact] = query[0, 0, 0].item()
    assert firsts == {False: 1.0, True: 1.0078125}, firsts
    # a bf16 table: bf16 arithmetic; on bit patterns the result is far outside the bound (a false failure)
    query, key = randn(3, 2, 16, dtype=torch.bfloat16, seed=6), randn(3, 1, 16, dtype=torch.bfloat16, seed=7)
    table, positions = rope_table(16, torch.bfloat16), torch.tensor([3, 0, 9], device=DEVICE)
    for exact in (False, True):
        got = query.clone()
        liger(exact_bf16=exact).rotary_embedding(positions, got, key.clone(), 16, table, True)
        assert (_outside_bound(got, query, positions, table, 16) > 0) != exact, exact
    # planted: Liger's kernel storing with explicit truncation still truncates with the correction on
    source = (package_dir() / ROPE_FILE).read_text()
    planted = source.replace("tl.store(q_ptr + first_half_q_offsets, new_q_tile_1, mask=first_q_mask)",
                             "tl.store(q_ptr + first_half_q_offsets, new_q_tile_1.to(tl.bfloat16, "
                             "fp_downcast_rounding='rtz'), mask=first_q_mask)", 1)
    assert planted != source, "Liger's forward store of q's first half changed: update the planted bug"
    positions, query, key, table = bf16_tie_case()
    liger(source=planted).rotary_embedding(positions, query, key, 2, table, True)
    assert (query[0, 0, 0].item(), key[0, 0, 0].item()) == (1.0, 1.0078125), "only q was planted to truncate"


def test_mla_fuse_verify_runs_it_on_one_models_deployments(liger_root, verify_one_deployment):
    """The suite's own run of the adapter: Llama's rope calls pass (NeoX style, the one Liger has)."""
    code, report = verify_one_deployment("liger", **({PATH_ENV_VAR: liger_root} if liger_root else {}))
    assert code == 0 and report["verdict"] == "PASS", report["deployments"]
    assert {entry["verdict"] for entry in report["deployments"]} == {"pass"}, report["deployments"]
