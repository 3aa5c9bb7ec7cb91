"""
nanoCoLA model: a LLaMA decoder whose linear layers can be CoLA bottlenecks.

CoLA (Compute-Efficient Pre-Training of LLMs via Low-Rank Activation, EMNLP 2025) replaces each
full-size projection W (d_in x d_out) of a transformer block with a small auto-encoder

    y = silu(x @ A) @ B,        A: (d_in, r),  B: (r, d_out),  r ~ d / 4

so parameters and matmul FLOPs shrink by about 2x, while the non-linearity inside keeps the model
expressive enough to match full-rank perplexity. CoLA-M is the same model trained with a special
gradient checkpoint: for backward it keeps only the residual stream and the r-wide activations
z = x @ A, and recomputes everything else, which is cheap because only the up-projections B (and
attention) are recomputed, never the down-projections A.

Read top to bottom: config, building blocks (RMSNorm, RoPE, CoLALinear and its merged down products,
attention, MLP), the CoLA-M checkpoint and the block, the model, and its helpers (parameter and FLOP counts, optimizer,
generation, loading a checkpoint). The other methods around CoLA live whole in files of their own
under methods/ and are switched on here in one place each: a ModelConfig key, and one branch in
build_projection (the layers of TSVD, Low-Rank, SLTrain and ReLoRA) or Block (ELAS's MLP); GaLore and Fira
are optimizers (methods/galore.py, chosen in train.py). DLR is a few lines inside CoLALinear.
"""

import math
import os
from dataclasses import dataclass, replace
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from methods import elas, lowrank, relora, sltrain, tsvd

try:
    import cola_op  # the fused CoLA up-projection; without Triton installed, CoLA layers run eager PyTorch
except ImportError:
    cola_op = None
try:
    import cola_gemm  # the fused low-rank matmul, taken only at the shapes where a GPU measured it faster
except ImportError:
    cola_gemm = None


@dataclass
class ModelConfig:
    vocab_size: int = 50304  # GPT-2's 50257 tokens, padded to a multiple of 64
    block_size: int = 256  # longest sequence the model is trained on
    n_layer: int = 8
    n_head: int = 8
    n_embd: int = 512
    intermediate_size: int = 1376  # SwiGLU hidden width
    rank: int = 128  # 0: full-rank nn.Linear projections; > 0: CoLA bottlenecks of this width
    only_lr_act: bool = False  # True: the MLP drops SwiGLU's own SiLU (CoLA's layers are non-linear already)
    dlr_alpha: float = 0.0  # DLR: > 0 adds (alpha / sqrt(K)) * Expand_K(silu(z)) to each CoLA layer (paper: 1.0)
    dlr_scope: str = 'all'  # DLR on 'all' seven projections, or only on 'attn' or 'mlp'
    mlp: str = 'swiglu'  # 'swiglu', or 'elas' (methods/elas.py: 2:4 sparse squared-ReLU MLP)
    projection: str = 'cola'  # the projection when rank > 0: 'cola', or a method of methods/: 'tsvd' (rank = start
    #                           rank), 'low-rank', 'sltrain', 'relora'
    sltrain_delta: float = 0.03  # SLTrain: the sparse part's density
    sltrain_alpha: float = 32.0  # SLTrain: the low-rank part's scale is alpha / rank
    relora_alpha: float = 32.0  # ReLoRA: the LoRA branch's scale is alpha / rank
    relora_dropout: float = 0.0  # ReLoRA: dropout on the LoRA branch's input (official 0.1)
    norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    # how to run it, not what it is: a checkpoint loads whatever these say
    checkpointing: str = 'none'  # 'none' | 'full' (recompute whole blocks) | 'cola-m' (CoLA-M)
    fused_cola: bool = True  # up-projections through cola_op.silu_matmul (keeps z, not silu(z)), or cola_gemm where
    # measured faster; False: eager PyTorch

    def __post_init__(self):
        for name in ('vocab_size', 'block_size', 'n_layer', 'n_head', 'n_embd', 'intermediate_size'):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r}: expected a positive integer")
        if self.n_embd % self.n_head != 0 or (self.n_embd // self.n_head) % 2 != 0:
            raise ValueError(f"n_embd={self.n_embd} must split into n_head={self.n_head} heads of even size")
        # CoLA-M tells a down product x @ A by its weight's shape (see keep_z), so an A (d_in, r) must never have
        # the shape of a B (r, d_out): r narrower than d and f ensures it; a bottleneck is anyway.
        if not 0 <= self.rank < min(self.n_embd, self.intermediate_size):
            raise ValueError(f"rank={self.rank}: expected 0 (full-rank) or a bottleneck narrower than "
                             f"n_embd={self.n_embd} and intermediate_size={self.intermediate_size}")
        if not (self.norm_eps > 0 and self.rope_theta > 0):
            raise ValueError(f"norm_eps={self.norm_eps}, rope_theta={self.rope_theta}: expected positive numbers")
        if self.checkpointing not in ('none', 'full', 'cola-m'):
            raise ValueError(f"checkpointing={self.checkpointing!r}: expected 'none', 'full' or 'cola-m'")
        if self.dlr_alpha < 0 or self.dlr_scope not in ('all', 'attn', 'mlp') or (self.dlr_alpha > 0 and self.rank == 0):
            raise ValueError(f"dlr_alpha={self.dlr_alpha}, dlr_scope={self.dlr_scope!r}: expected dlr_alpha 0 (off) or "
                             f"positive on CoLA layers (rank > 0), dlr_scope 'all', 'attn' or 'mlp'")
        if self.mlp not in ('swiglu', 'elas'):
            raise ValueError(f"mlp={self.mlp!r}: expected 'swiglu' or 'elas'")
        if self.projection not in ('cola', 'tsvd', 'low-rank', 'sltrain', 'relora') or (self.projection != 'cola' and (
                self.rank == 0 or self.dlr_alpha > 0 or (self.checkpointing == 'cola-m' and self.projection != 'low-rank'))):
            raise ValueError(f"projection={self.projection!r}: expected 'cola', or 'tsvd', 'low-rank', 'sltrain' or 'relora' "
                             f"with rank > 0 and without DLR or CoLA-M, which are for CoLA layers (CoLA-M: Low-Rank too)")
        if not (0 < self.sltrain_delta <= 1 and self.sltrain_alpha > 0 and self.relora_alpha > 0
                and 0 <= self.relora_dropout < 1):
            raise ValueError(f"sltrain_delta={self.sltrain_delta}, sltrain_alpha={self.sltrain_alpha}, relora_alpha="
                             f"{self.relora_alpha}, relora_dropout={self.relora_dropout}: expected a density in (0, 1], "
                             f"positive scales and a dropout in [0, 1)")
        if self.checkpointing == 'cola-m' and self.rank == 0:
            raise ValueError("checkpointing='cola-m' needs CoLA layers: set rank > 0 (got rank=0, a full-rank model)")


# ----------------------------------------------------------------------------- building blocks

def rope_tables(head_dim, length, theta=10000.0):
    """cos and sin of the rotary angles, each (length, head_dim / 2), for positions 0 .. length - 1."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x, cos, sin):
    """Rotate each pair (x_i, x_{i + hd/2}) of x (B, H, T, hd) by its position's angle (LLaMA's 'rotate half')."""
    x1, x2 = x.float().chunk(2, dim=-1)
    out = torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)
    return out.type_as(x)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x.float(), (x.size(-1),), self.weight.float(), self.eps).type_as(x)


class CoLALinear(nn.Module):
    """The CoLA layer, a low-rank auto-encoder in place of a d_in x d_out linear layer:

        z = x @ A        (..., r)      down(): the activation CoLA-M keeps for backward
        y = silu(z) @ B  (..., d_out)  up(): rebuilt from z in backward

    Init as in the official code: A, B ~ N(0, 1) * r^(-1/4) * (d_in + d_out)^(-1/4), so that the
    product keeps the variance of a (d_in + d_out)^(-1/2)-scaled full-rank layer.
    """

    def __init__(self, d_in, d_out, rank, fused=True, dlr_alpha=0.0, gemm=True):
        super().__init__()
        std = rank ** -0.25 * (d_in + d_out) ** -0.25
        self.A = nn.Parameter(torch.randn(d_in, rank) * std)
        self.B = nn.Parameter(torch.randn(rank, d_out) * std)
        self.fused = fused and cola_op is not None
        self.gemm = fused and gemm and cola_gemm is not None  # may take cola_gemm's kernels (fused_layers); not CoLA-M
        self.down_product = torch.matmul  # x @ A; ELAS swaps in its 2:4 sparse product (the same numbers)
        # DLR: a fixed B-shaped residual (see latent_residual), saved with the weights
        self.register_buffer('dlr_residual', latent_residual(rank, d_out, dlr_alpha) if dlr_alpha > 0 else None)

    def forward(self, x):
        ys = fused_layers([self], x)  # cola_gemm's kernels where a GPU measured them faster at this shape, else None
        return ys[0] if ys else self.up(self.down(x))

    def down(self, x):
        return self.down_product(x, self.A)

    def up(self, z):
        # The fused op keeps only z for backward and rebuilds silu(z) there, where eager PyTorch
        # keeps z and silu(z).
        B = self.up_weight()  # (r, d_out)
        if self.fused:
            return cola_op.silu_matmul(z, B)
        return F.silu(z) @ B

    def up_weight(self):
        return self.B if self.dlr_residual is None else self.B + self.dlr_residual

    def fold_dlr(self):
        """Fold DLR's residual into B (exact): a plain CoLA layer with the same outputs."""
        if self.dlr_residual is not None:
            self.B.data += self.dlr_residual.to(self.B.dtype)
            self.dlr_residual = None


def latent_residual(rank, d_out, alpha):
    """DLR (Zero-Inference-Cost Latent Residuals): y = silu(z) @ B + (alpha / sqrt(K)) Expand_K(silu(z)),
    K = ceil(d_out / r), where Expand_K copies latent o // K into output column o (latent j fills
    columns jK .. jK+K-1; when r does not divide d_out the last latents get fewer copies or none).
    Expand_K(s) = s @ R with R[o // K, o] = 1, so DLR is y = silu(z) @ (B + (alpha / sqrt(K)) R): the
    fused kernel runs unchanged, B's gradient is unchanged, and folding R into B after training is
    exact. Returns (alpha / sqrt(K)) R, (r, d_out)."""
    K = math.ceil(d_out / rank)
    R = torch.zeros(rank, d_out)
    R[torch.arange(d_out) // K, torch.arange(d_out)] = 1.0
    return alpha / math.sqrt(K) * R


def shared_down(layers, x):
    """The down-projections of CoLA layers that read the same x (q, k, v; gate, up) as one product:

        [z_1 | ... | z_n] = x @ [A_1 | ... | A_n]      (..., n r)

    the columns of one product being those of the n products, so the function is the n layers' own. One GEMM n times
    wider than each skinny one (it fills a GPU better), x read once, and in backward dx = dz @ [A_1 | ... | A_n]^T,
    one product where autograd would add n. Returns z_1, ..., z_n, each (..., r)."""
    A = torch.cat([layer.A for layer in layers], dim=1)  # (d_in, n r): a copy of the weights, small beside x
    return (x @ A).split([layer.A.size(1) for layer in layers], dim=-1)


def fan_out(layers, x):
    """Each layer of layers applied to x: CoLA layers through shared_down, one down product for all (or fused), any
    other method's layers (nn.Linear, TSVD, ...) one by one."""
    if all(type(layer) is CoLALinear for layer in layers):
        return fused_layers(layers, x) or [layer.up(z) for layer, z in zip(layers, shared_down(layers, x))]
    return [layer(x) for layer in layers]


def fused_layers(layers, x):
    """The CoLA layers that read x, through cola_gemm's kernels (SiLU in the GEMMs' epilogues) where a GPU measurement
    found them faster than the plain path at this shape (cola_gemm.FASTER): their outputs; else None."""
    if cola_gemm is None or not cola_gemm.FASTER:  # no measured shape (today): nothing more to look at
        return None
    if not all(layer.gemm and layer.down_product is torch.matmul for layer in layers):
        return None
    config = cola_gemm.chosen(x, layers[0].A.size(0), [layer.B.shape for layer in layers])
    if config is None:
        return None
    A = torch.cat([layer.A for layer in layers], dim=1)  # (d_in, n r), as in shared_down
    return cola_gemm.cola_layers(x, A, [layer.up_weight() for layer in layers], config)


def build_projection(d_in, d_out, config, part):
    """A projection of a block's part ('attn' or 'mlp'): nn.Linear for the full-rank baseline,
    CoLALinear when config.rank > 0 (with DLR where config.dlr_scope covers the part), or another
    method's layer, each from its own file."""
    if config.rank > 0 and config.projection == 'tsvd':
        return tsvd.TSVDLinear(d_in, d_out, config.rank)
    if config.rank > 0 and config.projection == 'low-rank':
        return lowrank.LowRankLinear(d_in, d_out, config.rank)
    if config.rank > 0 and config.projection == 'sltrain':
        return sltrain.SLTrainLinear(d_in, d_out, config.rank, config.sltrain_delta, config.sltrain_alpha)
    if config.rank > 0 and config.projection == 'relora':
        return relora.ReLoRALinear(d_in, d_out, config.rank, config.relora_alpha, config.relora_dropout)
    if config.rank > 0:
        dlr = config.dlr_alpha if config.dlr_scope in ('all', part) else 0.0
        return CoLALinear(d_in, d_out, config.rank, config.fused_cola, dlr, gemm=config.checkpointing != 'cola-m')
    return nn.Linear(d_in, d_out, bias=False)


class Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        d, self.n_head = config.n_embd, config.n_head
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (build_projection(d, d, config, 'attn') for _ in range(4))

    def forward(self, x, cos, sin, kv_cache=None):
        return self.o_proj(self.attend(x, cos, sin, kv_cache))

    def attend(self, x, cos, sin, kv_cache=None):
        """Causal multi-head attention with RoPE, up to o_proj's input (separate so that CoLA-M
        can cut the branch inside o_proj): (B, T, d) -> (B, T, d)."""
        B, T, C = x.shape
        q, k, v = (y.view(B, T, self.n_head, -1).transpose(1, 2) for y in fan_out((self.q_proj, self.k_proj, self.v_proj), x))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)  # (B, H, T, hd)
        past = kv_cache.length if kv_cache is not None else 0
        if kv_cache is not None:
            k, v = kv_cache.append(k, v)  # (B, H, past + T, hd)
        if past == 0:  # causal: is_causal's mask is aligned to the top-left, right when queries and keys start together
            y = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1)
        else:  # new token i sits at position past + i and sees keys 0 .. past + i
            mask = torch.ones(T, past + T, dtype=torch.bool, device=q.device).tril(diagonal=past)  # (T, past + T)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return y.transpose(1, 2).reshape(B, T, C)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)); with only_lr_act the gate's own SiLU is dropped."""

    def __init__(self, config):
        super().__init__()
        d, f = config.n_embd, config.intermediate_size
        self.gate_proj, self.up_proj = build_projection(d, f, config, 'mlp'), build_projection(d, f, config, 'mlp')
        self.down_proj = build_projection(f, d, config, 'mlp')
        self.gate_act = nn.Identity() if config.only_lr_act else nn.SiLU()

    def projections(self):
        return [self.gate_proj, self.up_proj, self.down_proj]

    def forward(self, x):
        return self.down_proj(self.hidden_activation(x))

    def hidden_activation(self, x):
        """The hidden layer, down_proj's input (separate so that CoLA-M can cut the branch inside
        down_proj): (B, T, d) -> (B, T, f)."""
        gate, up = fan_out((self.gate_proj, self.up_proj), x)
        return self.gate_act(gate) * up


# ----------------------------------------------------------------------------- CoLA-M and the block

def keep_z(down_shapes, ctx, op, *args, **kwargs):
    """CoLA-M's rule: save the down-projections z = x @ A, the matmuls whose weight has the shape of an A of the
    block, or of merged ones [A_q | A_k | A_v], [A_gate | A_up] (down_shapes); recompute everything else. The
    weight's shape, not the output's width: at 130m 3r = d, the width of q = silu(z_q) @ B_q too."""
    if op is torch.ops.aten.mm.default and tuple(args[1].shape) in down_shapes:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def cola_m_checkpoint(fn, down_shapes, x):
    """fn(x), keeping for backward only x and the z of the CoLA layers inside fn."""
    context_fn = partial(create_selective_checkpoint_contexts, partial(keep_z, down_shapes))
    return checkpoint(fn, x, use_reentrant=False, preserve_rng_state=False, context_fn=context_fn)


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attn_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.attn = Attention(config)
        self.mlp_norm = RMSNorm(config.n_embd, config.norm_eps)
        if config.mlp == 'elas':  # the same face as MLP's: projections(), hidden_activation(), down_proj
            self.mlp = elas.ElasMLP(config.n_embd, config.intermediate_size, partial(build_projection, config=config, part='mlp'))
        else:
            self.mlp = MLP(config)
        self.checkpointing = config.checkpointing

    def projections(self):
        """The block's projections, q, k, v, o, then the MLP's (gate, up, down)."""
        return [self.attn.q_proj, self.attn.k_proj, self.attn.v_proj, self.attn.o_proj, *self.mlp.projections()]

    def down_shapes(self):
        """The weights' shapes of the down products CoLA-M keeps: each layer's A, and fan_out's merged [A_q | A_k | A_v]
        and [A_gate | A_up] (ModelConfig's rank < min(d, f) keeps every one of them apart from every B)."""
        merged = [(self.attn.q_proj, self.attn.k_proj, self.attn.v_proj)]
        if isinstance(self.mlp, MLP):
            merged.append((self.mlp.gate_proj, self.mlp.up_proj))
        return ({tuple(p.A.shape) for p in self.projections()}
                | {(layers[0].A.size(0), sum(p.A.size(1) for p in layers)) for layers in merged})

    def forward(self, x, cos, sin, kv_cache=None):
        mode = self.checkpointing if torch.is_grad_enabled() else 'none'
        # No dropout: nothing random to replay, so the checkpoints keep no RNG state.
        if mode == 'full':  # vanilla gradient checkpointing: keep x, recompute the whole block in backward
            return checkpoint(self.plain_forward, x, cos, sin, use_reentrant=False, preserve_rng_state=False,
                              early_stop=False)
        if mode == 'cola-m':
            return self.cola_m_forward(x, cos, sin)
        return self.plain_forward(x, cos, sin, kv_cache)

    def plain_forward(self, x, cos, sin, kv_cache=None):
        h = x + self.attn(self.attn_norm(x), cos, sin, kv_cache)
        return h + self.mlp(self.mlp_norm(h))

    def cola_m_forward(self, x, cos, sin):
        """CoLA-M: the same block, keeping per token only the residual stream x and h (2d values)
        and the seven r-wide z (7r). Each residual branch is checkpointed from the stream up to the
        z of its last layer (o_proj, down_proj); that layer's up-projection runs outside the
        checkpoint, so backward rebuilds q, k, v, gate and up from their z, never a down-projection."""
        o_proj, down_proj, shapes = self.attn.o_proj, self.mlp.down_proj, self.down_shapes()
        z_o = cola_m_checkpoint(lambda x: o_proj.down(self.attn.attend(self.attn_norm(x), cos, sin)), shapes, x)
        h = x + o_proj.up(z_o)
        z_down = cola_m_checkpoint(lambda h: down_proj.down(self.mlp.hidden_activation(self.mlp_norm(h))), shapes, h)
        return h + down_proj.up(z_down)


# ----------------------------------------------------------------------------- the model

class KVCache:
    """One block's keys and values of the positions seen so far, for generation."""

    def __init__(self, max_len):
        self.max_len, self.length, self.k, self.v = max_len, 0, None, None

    def append(self, k, v):  # k, v: (B, H, T, hd)
        if self.k is None:
            B, H, _, hd = k.shape
            self.k, self.v = k.new_empty(B, H, self.max_len, hd), v.new_empty(B, H, self.max_len, hd)
        T = k.size(2)
        self.k[:, :, self.length:self.length + T], self.v[:, :, self.length:self.length + T] = k, v
        self.length += T
        return self.k[:, :, :self.length], self.v[:, :, :self.length]


class Transformer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.n_embd, config.norm_eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        cos, sin = rope_tables(config.n_embd // config.n_head, config.block_size, config.rope_theta)
        self.register_buffer('rope_cos', cos, persistent=False)  # (block_size, hd / 2)
        self.register_buffer('rope_sin', sin, persistent=False)
        for module in self.modules():  # full-size weights ~ N(0, 0.02); CoLALinear initialised itself
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets=None, kv_caches=None):
        """idx (B, T) token ids -> logits (B, T, vocab_size) and, given targets (B, T), the mean
        cross-entropy (targets of -1 are ignored). kv_caches (one per block) turns on incremental
        decoding: idx then holds only the new tokens, one or more, each seeing every cached position."""
        B, T = idx.shape
        start = kv_caches[0].length if kv_caches else 0
        if start + T > self.config.block_size:
            raise ValueError(f"sequence of {start + T} tokens is longer than block_size={self.config.block_size}")
        cos, sin = self.rope_cos[start:start + T], self.rope_sin[start:start + T]
        x = self.tok_emb(idx)  # (B, T, d)
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, kv_caches[i] if kv_caches else None)
        logits = self.lm_head(self.norm(x))  # (B, T, vocab_size)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    # ------------------------------------------------------------------------- helpers

    def num_params(self, non_embedding=True):
        """Parameter count; non_embedding leaves out the token embedding and the output layer."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.tok_emb.weight.numel() + self.lm_head.weight.numel()
        return n

    def flops_per_token(self, seq_len, batch_size=1, recomputation=True):
        """Training FLOPs per token, from the layers as they are now: per matmul multiply-add 2 forward, 2
        for the input's gradient and 2 for the weight's (a projection's multiply-adds per token are its
        parameter count for nn.Linear, CoLA, TSVD and Low-Rank; SLTrain multiplies by its dense W; ReLoRA's
        frozen W gets no weight gradient: 4); attention's scores and mixing (4 * seq_len * d forward, over
        the whole T x T square, as FlopCounterMode counts it; 2x that in backward); SLTrain's rebuild of W
        once per forward call, shared by its batch_size x seq_len tokens; plus, with recomputation, what the
        checkpointing recomputes in backward (the hardware's FLOPs: HFU in PaLM's terms; without, the model's:
        MFU). Elementwise work is not counted."""
        c = self.config
        attention = 4 * seq_len * c.n_embd
        total = 6 * c.n_embd * c.vocab_size
        for block in self.blocks:
            projections = block.projections()
            multiply_adds = sum(proj.A.size(1) * proj.B.size(0) if isinstance(proj, sltrain.SLTrainLinear)
                                else sum(p.numel() for p in proj.parameters()) for proj in projections)
            frozen = sum(p.numel() for proj in projections for p in proj.parameters() if not p.requires_grad)
            rebuild = sum(proj.rebuild_flops() for proj in projections if isinstance(proj, sltrain.SLTrainLinear))
            total += 6 * multiply_adds - 2 * frozen + 3 * attention + rebuild / (batch_size * seq_len)
            if not recomputation:
                continue
            if c.checkpointing == 'full':  # the whole block's forward again
                total += 2 * multiply_adds + attention + rebuild / 3 / (batch_size * seq_len)
            elif c.checkpointing == 'cola-m':  # attention and the up-projections inside the checkpoints (not o's, down's)
                total += 2 * sum(proj.B.numel() for proj in projections
                                 if proj not in (block.attn.o_proj, block.mlp.down_proj)) + attention
        return total

    def fold_dlr(self):
        """DLR folded into B (exact): this model becomes a plain CoLA model with the same outputs,
        CoLA's parameter names and count and no DLR buffers."""
        for module in self.modules():
            if isinstance(module, CoLALinear):
                module.fold_dlr()
        self.config = replace(self.config, dlr_alpha=0.0)
        return self

    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        """AdamW with weight decay on the matrices (A, B, linear and embedding weights, TSVD's S), none on
        norms and on TSVD's orthonormal U and V."""
        params = {n: p for n, p in self.named_parameters() if p.requires_grad}
        decayed = [n for n, p in params.items() if p.dim() >= 2 and not n.endswith(('.U', '.V'))]  # TSVD: on S only
        groups = [
            {'params': [params[n] for n in decayed], 'weight_decay': weight_decay},
            {'params': [p for n, p in params.items() if n not in decayed], 'weight_decay': 0.0},
        ]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, fused=device_type == 'cuda')

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """Continue idx (B, T) by max_new_tokens tokens, sampling from softmax(logits / temperature)
        restricted to the top_k most likely (temperature 0: greedy). A KV cache makes each new token
        cost one position's forward: prefill the prompt, then feed one token at a time. When the
        context fills block_size, the oldest half is dropped and the cache refilled from the rest,
        so each token sees at least block_size / 2 tokens of context."""
        block_size, caches = self.config.block_size, None
        for _ in range(max_new_tokens):
            if caches is None or caches[0].length == block_size:  # start, or restart from the last half
                caches = [KVCache(block_size) for _ in self.blocks]
                new = idx if idx.size(1) < block_size else idx[:, -(block_size // 2):]
            logits, _ = self(new, kv_caches=caches)
            logits = logits[:, -1, :].float()  # (B, vocab_size)
            if temperature == 0:
                new = logits.argmax(dim=-1, keepdim=True)
            else:  # the largest logit moved to 0 first, so that a tiny temperature overflows nothing (greedy in the limit)
                logits = (logits - logits.max(dim=-1, keepdim=True).values) / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, [-1]]
                    logits[logits < kth] = -float('inf')
                new = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat([idx, new], dim=1)
        return idx


def load_checkpoint(path):
    """A checkpoint of train.py as a dict, or a one-line exit saying what is wrong with it. Loaded as data
    (weights_only): a file someone hands over never runs code."""
    if not os.path.exists(path):
        raise SystemExit(f"{path} does not exist")
    try:
        checkpoint = torch.load(path, map_location='cpu', weights_only=True)
    except Exception as e:
        best = os.path.join(os.path.dirname(path), 'best.pt')
        why = ('holds objects other than tensors and plain values' if 'unsupported GLOBAL' in str(e)
               else 'is truncated or corrupt')  # (weights_only refuses what would build other objects or run code)
        raise SystemExit(f"{path} {why} ({type(e).__name__})"
                         + (f"; {best} holds the best state so far" if os.path.exists(best) and best != path else '')) from None
    if not isinstance(checkpoint, dict) or not {'model', 'model_config', 'config', 'encoding'} <= checkpoint.keys():
        raise SystemExit(f"{path} is not a checkpoint of train.py")
    return checkpoint


def describe_checkpoint(checkpoint, path):
    """One line saying which state a script reads: the file, its step, and where the best one is."""
    iters, max_iters = checkpoint.get('iter_num', '?'), checkpoint['config'].get('max_iters', '?')
    best = checkpoint.get('best_val_loss', float('inf'))
    return (f"{path}: the state after iter {iters} of {max_iters}" + (f" (the run's best validation loss so far, "
            f"{best:.4f}, is best.pt's)" if os.path.basename(path) == 'ckpt.pt' and best < float('inf') else ''))


def model_from_checkpoint(checkpoint, device='cpu', path='the checkpoint', **how):
    """The model of a checkpoint as it was trained (TSVD's ranks then, ELAS's sparsity then), on device,
    run as `how` says (checkpointing, fused_cola; default: no checkpointing). The one place that builds
    a model from a checkpoint: train.py's resume, sample.py, analyze.py and the tests use it."""
    try:
        config = ModelConfig(**{**checkpoint['model_config'], 'checkpointing': 'none', **how})
        with torch.device(device):
            model = Transformer(config)
        tsvd.match_ranks(model, checkpoint['model'])
        model.load_state_dict(checkpoint['model'])
        if config.mlp == 'elas':
            elas.set_sparsity(model, checkpoint['iter_num'] >= checkpoint['config']['elas_warmup_iters'])
    except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as e:  # a hand-edited or mismatched file
        why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SystemExit(f"{path}: its weights do not make the model its model_config describes ({why[:200]})") from None
    return model
