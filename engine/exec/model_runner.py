"""Owns the model and the KV pool; turns a scheduled batch into tensors and runs one forward.

The pool is allocated once here, sized from the memory budget, and never resized. A step's inputs
go to the device in one copy (engine/exec/step_inputs.py). On CUDA, warm_up() compiles the Triton
variants and captures decode CUDA graphs per batch bucket (engine/exec/cuda_graphs.py); pure decode
steps replay a graph unless enforce_eager. The CPU path runs the eager loop, exact fp32.
"""

from __future__ import annotations

import logging

import torch

import kernels
from kernels import kv_quant
from engine.config import EngineConfig, DEFAULT_CPU_KV_CACHE_GIB, DEFAULT_GPU_MEMORY_FRACTION
from engine.exec import huge_pages
from engine.exec.models.llama import AttentionMetadata, LlamaModel
from engine.exec.step_inputs import StagingBuffer, pack_step
from engine.kv.cache_spec import KVCacheLayout
from engine.step_plan import StepPlan

log = logging.getLogger("paged_chat.engine")
GRAPH_MAX_LEN = 8192  # decode graphs cover contexts up to this; longer ones run eagerly


def choose_num_blocks(
    cfg: EngineConfig, bytes_per_block: int, reserved: int = 0, budget: float | None = None
) -> int:
    """Blocks of the pool: cfg.num_blocks, or the KV budget less `reserved` bytes (state slots)."""
    if cfg.num_blocks is not None:
        return cfg.num_blocks
    budget = kv_budget(cfg) if budget is None else budget
    return max(1, int((budget - reserved) // bytes_per_block))


def choose_state_slots(cfg: EngineConfig, bytes_per_slot: int, budget: float | None) -> int:
    """State slots of a model with linear-attention layers (engine/kv/state_pool.py): running
    sequences, parked chats and checkpoints; slot 0 is reserved. Within half the KV budget."""
    n = cfg.state_slots or (cfg.max_num_seqs * 3 // 2 + 16)
    if cfg.state_slots is None and budget is not None:
        n = min(n, max(4, int(budget // 2 // bytes_per_slot)))
    return n + 1


def kv_budget(cfg: EngineConfig) -> float:
    if cfg.kv_cache_gib is not None:
        budget = cfg.kv_cache_gib * 2**30
    elif cfg.device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info(torch.device(cfg.device))
        budget = free * DEFAULT_GPU_MEMORY_FRACTION
    else:
        budget = DEFAULT_CPU_KV_CACHE_GIB * 2**30
    return budget


def _layer_kv(layout: KVCacheLayout, kv_layers: tuple, num_layers: int) -> tuple:
    """(pool slot, group) of each model layer; None for a layer that keeps no KV."""
    out: list = [None] * num_layers
    for ordinal, i in enumerate(kv_layers):
        out[i] = layout.layer_kv[ordinal]
    return tuple(out)


class ModelRunner:
    def __init__(
        self, cfg: EngineConfig, hf_config, weights: dict, weights_key: tuple | None = None
    ):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.dtype = cfg.torch_dtype
        max_pos = getattr(hf_config, "max_position_embeddings", 4096)
        self.model = LlamaModel(
            hf_config,
            weights,
            self.dtype,
            self.device,
            max_positions=max(cfg.max_model_len or 0, max_pos),
            quantization=cfg.quantization,
            lean_step=cfg.lean_step,
            weights_key=weights_key,
            rope_context=cfg.max_model_len or max_pos,
        )
        self.backend = kernels.resolve_backend(cfg.attention_backend, self.device)
        if self.device.type == "cpu":  # which CPU path runs, said once at start-up
            log.info("CPU model path: %s", self.model.cpu_path)
        self.kv_dtype = kv_quant.pool_dtype(cfg.kv_cache_dtype, self.dtype)  # the pool's format
        m = self.model
        # int8/fp8 pools hold K and V rotated per head (kernels/kv_quant.py): 'hadamard' or 'none'
        self.kv_rotation = kv_quant.rotation_for(cfg.kv_cache_rotation, self.kv_dtype, m.head_dim)
        m.kv_rotation = (
            kv_quant.hadamard(m.head_dim, device=self.device)
            if self.kv_rotation == "hadamard"
            else None
        )
        # KV cache groups (engine/kv/cache_spec.py): layers of one attention kind share a group;
        # every group has P layer slots in the one pool (P = num_layers for a model of one kind)
        # (only attention layers keep KV: a Gated DeltaNet layer has no slot and no group;
        # kv_cache_groups=False: one full-attention group of every attention layer; attention still
        # applies each layer's window, but no block is ever given back: the layout before groups)
        kv_layers = m.spec.kv_layers
        self.kv_layout = (
            KVCacheLayout.from_layer_windows([m.spec.layers[i].window for i in kv_layers])
            if cfg.kv_cache_groups
            else KVCacheLayout.single(len(kv_layers))
        )
        m.kv_layer = _layer_kv(self.kv_layout, kv_layers, m.num_layers)
        P = self.kv_layout.pool_layers
        # bytes of one block / block_size: 2 x P layer slots x KV heads x row bytes
        self.kv_bytes_per_token = kv_quant.bytes_per_token(
            P, m.num_kv_heads, m.head_dim, self.kv_dtype
        )
        self.weights_kv_bytes_per_token = kv_quant.bytes_per_token(
            P, m.num_kv_heads, m.head_dim, self.dtype
        )  # for "what it buys"
        self.kv_bytes_per_block = self.kv_bytes_per_token * cfg.block_size
        # linear-attention layers: one fixed-size state per holder (engine/exec/models/linear_state.py)
        self.linear_state, self.num_state_slots, self.state_bytes_per_slot = None, 0, 0
        budget = (
            kv_budget(cfg) if cfg.num_blocks is None else None
        )  # measured once (CUDA: free memory)
        if m.spec.linear_layers:
            from engine.exec.models.linear_state import LinearState

            n_lin = len(m.spec.linear_layers)
            self.state_bytes_per_slot = LinearState.bytes_per_slot(m.spec.linear, n_lin, self.dtype)
            self.num_state_slots = choose_state_slots(cfg, self.state_bytes_per_slot, budget)
            m.linear_state = self.linear_state = LinearState(
                m.spec.linear, n_lin, self.num_state_slots, self.dtype, self.device
            )
        self.num_blocks = choose_num_blocks(
            cfg, self.kv_bytes_per_block, self.num_state_slots * self.state_bytes_per_slot, budget
        )
        # one sequence must always fit in the pool on its own, or preemption could never help
        self.max_model_len = min(
            cfg.max_model_len or max_pos,
            self.kv_layout.max_tokens(self.num_blocks, cfg.block_size, cfg.max_num_batched_tokens),
        )
        # one allocation for the whole life of the engine; a quantized row carries its scale
        # (on CPU on 2 MiB pages: decode attention reads blocks scattered over the whole pool)
        shape = (
            2,
            P,
            self.num_blocks,
            cfg.block_size,
            m.num_kv_heads,
            kv_quant.row_width(m.head_dim, self.kv_dtype),
        )
        self.kv_pool = (
            huge_pages.zeros(shape, self.kv_dtype)
            if self.device.type == "cpu"
            else torch.zeros(shape, dtype=self.kv_dtype, device=self.device)
        )
        self.staging = StagingBuffer(self.device)  # one pinned buffer, one copy per step
        self.graphs = None  # DecodeGraphs after warm_up() on CUDA
        self.warmup_stats: dict = {}
        self.warm_up()

    def warm_up(self) -> None:
        """CUDA only: compile every Triton variant, then capture the decode graphs (unless
        enforce_eager). Progress goes to stderr."""
        if self.device.type != "cuda":
            return
        from engine.exec.warmup import warm_up

        width = -(-self.max_model_len // self.cfg.block_size)
        self.warmup_stats = warm_up(self.model, self.kv_pool, self.backend, width)
        # (the torch reference syncs; routed experts and linear-attention states are not captured)
        if not self.cfg.enforce_eager and self.backend == "triton" and self.model.spec.plain_layers:
            from engine.exec.cuda_graphs import DecodeGraphs

            self.graphs = DecodeGraphs(
                self.model,
                self.kv_pool,
                self.cfg.block_size,
                self.cfg.max_num_seqs,
                min(self.max_model_len, GRAPH_MAX_LEN),
                self.backend,
            )
            self.warmup_stats["graph_capture_s"] = self.graphs.capture()

    def run_on_device(self, plan: StepPlan) -> torch.Tensor:
        """One forward over the step's plan (engine/step_plan.py): the copy-on-write copies, then
        the packed rows. Returns logits [len(plan.logits), vocab], one row per logits entry in
        order, on the model's device (the sampler runs there); a graph's logits are a view valid
        until the next step. The runner reads the plan only: it never asks the KV manager."""
        copies = plan.copies
        if self.graphs is not None and self.graphs.can_run(plan):
            if copies:
                kernels.copy_blocks(
                    self.kv_pool,
                    torch.tensor(copies, dtype=torch.int64, device=self.device),
                    backend=self.backend,
                )
                copies = []
            logits = self.graphs.run(plan)
            if logits is not None:
                return logits
        ids, pos, slots, tables, seq_lens, cu, logits_idx, copy_t, max_q = pack_step(
            self.staging, plan
        )
        if copy_t is not None and copies:
            kernels.copy_blocks(self.kv_pool, copy_t, backend=self.backend)
        state_slots = None
        if self.linear_state is not None:  # copies first (forks, checkpoints), then the rows' slots
            self.linear_state.copy_slots(plan.state_copies)
            state_slots = torch.tensor(
                [r.state_slots[0] for r in plan.rows], dtype=torch.int64, device=self.device
            )
        groups = len(slots) > 1  # KV cache groups: each its own slots and tables
        meta = AttentionMetadata(
            slot_mapping=slots[0],
            block_tables=tables[0],
            seq_lens=seq_lens,
            cu_seqlens_q=cu,
            max_seqlen_q=max_q,
            backend=self.backend,
            group_slots=slots if groups else None,
            group_tables=tables if groups else None,
            state_slots=state_slots,
        )
        return self.model.forward(
            ids, pos, self.kv_pool, meta, logits_idx, argmax_only=plan.argmax_only
        )
