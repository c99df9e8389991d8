"""Our cos/sin tables are Hugging Face transformers' own, bit for bit (docs/INPUTS.md "Tables").

transformers builds the DeepSeek YaRN frequencies in ``modeling_rope_utils._compute_yarn_parameters``
and the cos/sin in each model's rotary module; vLLM's ``DeepseekScalingRotaryEmbedding`` evaluates
the same fp32 expressions in the same order. The configs are built locally from the rope parameters
of the models' public ``config.json`` files (no network):

* DeepSeek-V3 / R1: https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json
* DeepSeek-V2: https://huggingface.co/deepseek-ai/DeepSeek-V2/blob/main/config.json
* DeepSeek-V2-Lite: https://huggingface.co/deepseek-ai/DeepSeek-V2-Lite/blob/main/config.json
* Kimi-K2 (the DeepSeek-V3 architecture): https://huggingface.co/moonshotai/Kimi-K2-Instruct/blob/main/config.json

Every row of every table is compared (the whole ``M * f`` rows: the fp32 angle error grows with the
position), in fp32 and after the cast to bf16/fp16 that engines store.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers.models.deepseek_v2.configuration_deepseek_v2 import DeepseekV2Config
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2RotaryEmbedding
from transformers.models.deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RotaryEmbedding
from transformers.models.llama.configuration_llama import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from mla_fuse.layers.rotary_embedding import DeepseekScalingRotaryEmbedding, RotaryEmbedding
from mla_fuse_reference import rope as ref_rope



@dataclasses.dataclass(frozen=True)
class YarnModel:
    """The rope fields of one model's config.json (``rope_scaling`` type ``yarn``)."""

    config_class: type
    max_position_embeddings: int
    rope_theta: float
    factor: float
    beta_fast: float
    beta_slow: float
    mscale: float
    mscale_all_dim: float
    original_max_position_embeddings: int = 4096
    qk_rope_head_dim: int = 64

    def transformers_config(self):
        scaling = dict(type="yarn", factor=self.factor, beta_fast=self.beta_fast, beta_slow=self.beta_slow,
                       mscale=self.mscale, mscale_all_dim=self.mscale_all_dim,
                       original_max_position_embeddings=self.original_max_position_embeddings)
        return self.config_class(max_position_embeddings=self.max_position_embeddings, rope_theta=self.rope_theta,
                                 qk_rope_head_dim=self.qk_rope_head_dim, rope_scaling=scaling)

    def ours(self) -> DeepseekScalingRotaryEmbedding:
        return DeepseekScalingRotaryEmbedding(
            self.qk_rope_head_dim, self.qk_rope_head_dim, self.original_max_position_embeddings, self.rope_theta, False,
            self.factor, beta_fast=self.beta_fast, beta_slow=self.beta_slow, mscale=self.mscale,
            mscale_all_dim=self.mscale_all_dim, use_custom_op=False)

    def reference(self, compute_dtype: torch.dtype) -> torch.Tensor:
        return ref_rope.deepseek_yarn_cos_sin_cache(
            self.qk_rope_head_dim, self.original_max_position_embeddings, self.rope_theta, self.factor,
            beta_fast=self.beta_fast, beta_slow=self.beta_slow, mscale=self.mscale, mscale_all_dim=self.mscale_all_dim,
            compute_dtype=compute_dtype)


YARN_MODELS = {
    "DeepSeek-V3": YarnModel(DeepseekV3Config, 163840, 10000, 40, 32, 1, 1.0, 1.0),
    "DeepSeek-V2": YarnModel(DeepseekV2Config, 163840, 10000, 40, 32, 1, 0.707, 0.707),
    "DeepSeek-V2-Lite": YarnModel(DeepseekV2Config, 163840, 10000, 40, 32, 1, 0.707, 0.707),
    "Kimi-K2": YarnModel(DeepseekV3Config, 131072, 50000, 32.0, 1.0, 1.0, 1.0, 1.0),
}
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# one table per distinct set of rope fields (DeepSeek-V2 and V2-Lite share theirs)
TABLES = {" = ".join(name for name, model in YARN_MODELS.items() if model == distinct): distinct
          for distinct in dict.fromkeys(YARN_MODELS.values())}


def transformers_table(rotary, num_positions: int, dtype: torch.dtype) -> torch.Tensor:
    """``[P, R]``: the cos and sin halves transformers' rotary module returns for positions ``0..P-1``."""
    cos, sin = rotary(torch.empty(0, dtype=dtype), torch.arange(num_positions)[None, :])
    half = cos.size(-1) // 2  # transformers repeats the R/2 angles: cat(freqs, freqs)
    return torch.cat([cos[0, :, :half], sin[0, :, :half]], dim=-1)


def assert_bitwise_equal(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    differ = actual.view(torch.int8) != expected.view(torch.int8)
    rows = differ.view(actual.size(0), -1).any(dim=1).nonzero().flatten()
    assert rows.numel() == 0, (f"{what}: {rows.numel()} of {actual.size(0)} rows differ, first at position "
                               f"{int(rows[0])}: {actual[rows[0]].tolist()[:4]} vs {expected[rows[0]].tolist()[:4]}")


@pytest.mark.parametrize("name", YARN_MODELS)
def test_yarn_frequencies_and_magnitude_are_transformers_own(name):
    model = YARN_MODELS[name]
    rotary_class = DeepseekV2RotaryEmbedding if model.config_class is DeepseekV2Config else DeepseekV3RotaryEmbedding
    theirs = rotary_class(model.transformers_config())
    layer = model.ours()
    assert torch.equal(layer._compute_inv_freq(), theirs.inv_freq)
    assert layer.mscale == theirs.attention_scaling


@pytest.mark.parametrize("name", TABLES)
def test_yarn_table_is_transformers_own_in_every_dtype(name):
    """The product's table (fp32) and the reference's expressions evaluated in fp32 (its default is
    float64, CONTRACT §1) both equal the table transformers' cos/sin module builds."""
    model = TABLES[name]
    rotary = DeepseekV3RotaryEmbedding(model.transformers_config())  # the cos/sin module (V2's: below)
    table, reference_fp32 = model.ours().cos_sin_cache, model.reference(torch.float32)
    for dtype in DTYPES:
        expected = transformers_table(rotary, table.size(0), dtype)
        assert_bitwise_equal(table.to(dtype), expected, f"{name} table in {dtype}")
        assert_bitwise_equal(reference_fp32.to(dtype), expected, f"{name} reference (fp32 evaluation) in {dtype}")


def test_deepseek_v2_complex_form_differs_only_by_its_cos_routine():
    """transformers' DeepSeek-V2 class takes cos/sin from ``torch.polar`` (complex): the same angles, another
    elementwise routine; on the CPU it differs from ``cos``/``sin`` by at most 1 ulp (docs/INPUTS.md)."""
    model = YARN_MODELS["DeepSeek-V2"]
    table = model.ours().cos_sin_cache
    rotary = DeepseekV2RotaryEmbedding(model.transformers_config())
    freqs_cis = rotary(torch.empty(0), torch.arange(table.size(0))[None, :])[0]
    polar = torch.cat([freqs_cis.real, freqs_cis.imag], dim=-1)
    ulps = (polar.view(torch.int32).long() - table.view(torch.int32).long()).abs()
    assert ulps.max() <= 1


@pytest.mark.parametrize("theta, rotary_dim", [(10000.0, 128), (500000.0, 128), (1e6, 64)])
def test_plain_table_is_transformers_default_rope(theta, rotary_dim):
    config = LlamaConfig(hidden_size=rotary_dim * 4, num_attention_heads=4, max_position_embeddings=8192,
                         rope_theta=theta)
    table = RotaryEmbedding(rotary_dim, rotary_dim, 8192, theta, True, use_custom_op=False).cos_sin_cache
    for dtype in DTYPES:
        assert_bitwise_equal(table.to(dtype), transformers_table(LlamaRotaryEmbedding(config), 8192, dtype),
                             f"plain table, base {theta}, in {dtype}")
