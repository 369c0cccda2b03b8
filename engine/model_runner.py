"""Owns the model and the KV pool; turns a scheduled batch into tensors and runs one forward.

The pool is allocated once here, sized from the memory budget, and never resized.
"""
from __future__ import annotations

import torch

import kernels
from engine.config import EngineConfig, DEFAULT_CPU_KV_CACHE_GIB, DEFAULT_GPU_MEMORY_FRACTION
from engine.kv_cache_manager import KVCacheManager
from engine.models.llama import AttentionMetadata, LlamaModel, head_dim_of
from engine.sequence import Sequence


from engine.model_info import kv_bytes_per_token as kv_bytes_per_token_of  # noqa: E402

def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """2 (K and V) x layers x KV heads x head_dim x dtype bytes — KV heads, not attention heads."""
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    itemsize = torch.empty((), dtype=dtype).element_size()
    return kv_bytes_per_token_of(config.num_hidden_layers, kv_heads, head_dim_of(config), itemsize)


def choose_num_blocks(cfg: EngineConfig, bytes_per_block: int) -> int:
    if cfg.num_blocks is not None:
        return cfg.num_blocks
    if cfg.kv_cache_gib is not None:
        budget = cfg.kv_cache_gib * 2**30
    elif cfg.device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(cfg.device))
        budget = free * DEFAULT_GPU_MEMORY_FRACTION
    else:
        budget = DEFAULT_CPU_KV_CACHE_GIB * 2**30
    return max(1, int(budget // bytes_per_block))


class ModelRunner:
    def __init__(self, cfg: EngineConfig, hf_config, weights: dict):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.dtype = cfg.torch_dtype
        max_pos = getattr(hf_config, "max_position_embeddings", 4096)
        self.model = LlamaModel(hf_config, weights, self.dtype, self.device,
                                max_positions=max(cfg.max_model_len or 0, max_pos))
        self.backend = kernels.resolve_backend(cfg.attention_backend, self.device)
        self.kv_bytes_per_token = kv_bytes_per_token(hf_config, self.dtype)
        self.kv_bytes_per_block = self.kv_bytes_per_token * cfg.block_size
        self.num_blocks = choose_num_blocks(cfg, self.kv_bytes_per_block)
        # one sequence must always fit in the pool on its own, or preemption could never help
        self.max_model_len = min(cfg.max_model_len or max_pos, self.num_blocks * cfg.block_size)
        m = self.model
        # one allocation for the whole life of the engine
        self.kv_pool = torch.zeros(2, m.num_layers, self.num_blocks, cfg.block_size, m.num_kv_heads,
                                   m.head_dim, dtype=self.dtype, device=self.device)

    def run(self, batch: list[tuple[Sequence, int, int]], kv: KVCacheManager,
            copies: list[tuple[int, int]], sample_rows: list[int]) -> torch.Tensor:
        """batch: [(seq, start, n)]; sample_rows: indices into batch that need next-token logits.
        Returns fp32 logits [len(sample_rows), vocab] on CPU."""
        if copies:
            kernels.copy_blocks(self.kv_pool, torch.tensor(copies, dtype=torch.int64, device=self.device),
                                backend=self.backend)
        ids, pos, slots, tables, seq_lens, cu = [], [], [], [], [], [0]
        for seq, start, n in batch:
            end = start + n
            ids.extend(seq.token_ids[start:end])
            pos.extend(range(start, end))
            slots.extend(kv.slots_for(seq.seq_id, start, end))
            tables.append(kv.block_table(seq.seq_id))
            seq_lens.append(end)
            cu.append(cu[-1] + n)
        width = max(len(t) for t in tables)
        dev = self.device
        table_t = torch.zeros(len(tables), width, dtype=torch.int32)
        for r, t in enumerate(tables):
            table_t[r, :len(t)] = torch.tensor(t, dtype=torch.int32)
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            block_tables=table_t.to(dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            cu_seqlens_q=torch.tensor(cu, dtype=torch.int32, device=dev),
            max_seqlen_q=max(n for _, _, n in batch),
            backend=self.backend,
        )
        logits_idx = torch.tensor([cu[r + 1] - 1 for r in sample_rows], dtype=torch.int64, device=dev)
        logits = self.model.forward(torch.tensor(ids, dtype=torch.int64, device=dev),
                                    torch.tensor(pos, dtype=torch.int64, device=dev),
                                    self.kv_pool, meta, logits_idx)
        return logits.cpu()
