# Sourced (`. ci/third_party_wheels.sh`) by .ci/run and by `ci/nightly.sh tests`: downloads the third-party
# packages whose kernel files the adapters' tests read (never installed, never imported) into reports/wheels/ and
# exports MLA_FUSE_*_WHEEL / MLA_FUSE_FLASH_ATTN_SDIST naming them (tests/conftest.py, third_party_root); a
# download that fails leaves its variable unset, and its tests fail under CI=true.
mkdir -p reports/wheels
# FlagGems is never installed (its exact pins of numpy, sqlalchemy, pyyaml, packaging must not reach this
# environment): tests/test_flaggems.py loads its kernel files from the wheel, unpacked (docs/THIRD_PARTY.md)
if pip download -q --no-deps flag-gems==5.0.2 -d reports/wheels; then
  export MLA_FUSE_FLAGGEMS_WHEEL="$(ls reports/wheels/flag_gems-5.0.2-*.whl)"
fi
# Liger-Kernel likewise (never imported: importing it runs its device dispatch): tests/test_liger.py reads
# liger_kernel/ops/rope.py from the wheel, unpacked
if pip download -q --no-deps liger-kernel==0.8.5 -d reports/wheels; then
  export MLA_FUSE_LIGER_WHEEL="$(ls reports/wheels/liger_kernel-0.8.5-*.whl)"
fi
# flash-attn likewise, from its sdist (no wheel without CUDA; `pip download` would run its setup.py, which
# imports torch): tests/test_flash_attn_rotary.py reads flash_attn/ops/triton/rotary.py from it, unpacked
if sdist=$(python3 ci/fetch_sdist.py flash-attn 2.8.3.post2 reports/wheels); then
  export MLA_FUSE_FLASH_ATTN_SDIST="$sdist"
fi
# SGLang likewise (never installed, never imported): tests/test_sglang_triton.py reads its Triton kernel files
# from the wheel, unpacked (platform-tagged cp311 manylinux; the kernels are Python files)
if pip download -q --no-deps --only-binary=:all: --python-version 3.11 --platform manylinux_2_34_x86_64 \
    sglang==0.5.23 -d reports/wheels; then
  export MLA_FUSE_SGLANG_WHEEL="$(ls reports/wheels/sglang-0.5.23-*.whl)"
fi
# LMDeploy likewise (never installed, never imported): tests/test_lmdeploy.py reads its PyTorch engine's Triton
# kernel files (pytorch/kernels/cuda/) from the wheel, unpacked (platform-tagged cp311 manylinux)
if pip download -q --no-deps --only-binary=:all: --python-version 3.11 --platform manylinux_2_28_x86_64 \
    lmdeploy==0.18.0 -d reports/wheels; then
  export MLA_FUSE_LMDEPLOY_WHEEL="$(ls reports/wheels/lmdeploy-0.18.0-*.whl)"
fi
