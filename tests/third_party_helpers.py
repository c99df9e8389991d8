"""What the tests of third-party adapters share (tests/test_flaggems.py, test_liger.py, test_flash_attn_rotary.py,
test_sglang_triton.py, test_lmdeploy.py): a loader of an adapter pointed at the project's files, a rope table,
seeded inputs, caches filled with a sentinel and their bits, and the check of the engine lines adapters cite."""

from __future__ import annotations

import pathlib
import re

import torch

from mla_fuse.kernels import INTERPRETED

DEVICE = "cuda" if torch.cuda.is_available() and not INTERPRETED else "cpu"
SENTINEL = 0x5A  # the byte an fp8 cache is filled with before a write (a float cache: 7.0)
TIE_BREAKER = 1 + 2.0 ** -8 + 2.0 ** -10  # bf16: 1.0078125 to nearest even, 1.0 truncated


def adapter_loader(adapter_class, root: str | None, path_env_var: str, monkeypatch, source_argument: str = "source"):
    """``load(SOURCE_ARGUMENT=None, **attributes)``: ``adapter_class(planted)`` reading the project from ``root``
    (None: the installed package; ``planted``: the adapter's argument of replaced kernel text, ``source`` or
    ``sources``), with ``attributes`` set on it (a test turning a correction off)."""
    if root is not None:
        monkeypatch.setenv(path_env_var, root)

    def load(**attributes):
        impl = adapter_class(attributes.pop(source_argument, None))
        for name, value in attributes.items():
            setattr(impl, name, value)
        return impl
    return load


def assert_cited_lines_hold(guard_tables, package: str, expected: dict[str, str], root: pathlib.Path) -> None:
    """Every ``path:line`` the adapters' ``GUARDED_BY_CALLER`` tables cite (``package/...py:N``; a bare ``:N``
    after one: that file's line N) is one of ``expected`` and holds its text in the file under ``root``: a
    new or moved citation fails here."""
    cited = set()
    for guards in guard_tables:
        for text in (text for by_limit in guards.values() for text in by_limit.values()):
            path = None
            for named, line in re.findall(rf"({package}/[\w/]+\.py)?:(\d+)", text):
                path = named or path
                if path is not None:
                    cited.add(f"{path}:{line}")
    assert cited == set(expected), sorted(cited ^ set(expected))
    for citation, text in expected.items():
        path, line = citation.rsplit(":", 1)
        assert text in (root / path).read_text().splitlines()[int(line) - 1], citation


def rope_table(rotary_dim: int, dtype, rows: int = 32) -> torch.Tensor:
    """A cos|sin table ``[rows, rotary_dim]`` of base 10000."""
    inv_freq = 10000.0 ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    angles = torch.arange(rows, dtype=torch.float64)[:, None] * inv_freq
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(dtype).to(DEVICE)


def randn(*shape, dtype, seed: int, scale: float = 4.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=generator) * scale).to(dtype).to(DEVICE)


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s bits, as integers of its width (compared exactly, NaNs and signed zeros included)."""
    return tensor.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[tensor.element_size()])


def sentinel_filled(shape, dtype) -> torch.Tensor:
    """A cache of ``shape`` before a write: ``SENTINEL`` bytes where ``dtype`` is one byte (uint8, float8), else 7.0."""
    if dtype.itemsize == 1:
        return torch.full(shape, SENTINEL, dtype=torch.uint8, device=DEVICE).view(dtype)
    return torch.full(shape, 7.0, dtype=dtype, device=DEVICE)


def bf16_tie_case():
    """One token, one head of 2, R = 2: ``a = 1, b = 0``, ``cos = 1 + 2^-8 + 2^-10`` (fp32), ``sin = 0``:
    the rotated first element is exactly ``cos``; bf16 to nearest even 1.0078125 (the reference's), truncated
    1.0. Returns ``positions, query, key, table``."""
    query = torch.tensor([[[1.0, 0.0]]], dtype=torch.bfloat16, device=DEVICE)
    table = torch.tensor([[TIE_BREAKER, 0.0]], dtype=torch.float32, device=DEVICE)
    return torch.tensor([0], device=DEVICE), query, query.clone(), table
