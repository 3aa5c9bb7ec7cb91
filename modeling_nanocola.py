"""
nanoCoLA's CoLA model for Hugging Face transformers, the modeling code an exported CoLA folder carries:

    model = AutoModelForCausalLM.from_pretrained('hf-cola-130m', trust_remote_code=True)

A CoLA model is Hugging Face's Llama with each of the seven projections of a block (q, k, v, o, gate, up, down)
replaced by the CoLA layer y = silu(x @ cola_a) @ cola_b, cola_a (d_in, r) and cola_b (r, d_out): the official CoLA
code's names and config fields (ColaConfig: model_type 'cola', rank, only_lr_act, the rest Llama's), so that one
folder loads here and in the official ColaForCausalLM. With only_lr_act the MLP drops SwiGLU's own SiLU (the gate's
CoLA layer is non-linear already). export.py copies this file into the folder; it imports nothing of nanoCoLA's.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM


class NanoCoLAConfig(LlamaConfig):
    model_type = 'cola'

    def __init__(self, rank=128, only_lr_act=False, **kwargs):
        self.rank, self.only_lr_act = rank, only_lr_act
        super().__init__(**kwargs)


class CoLALayer(nn.Module):
    """y = silu(x @ cola_a) @ cola_b in place of a d_in x d_out linear layer."""

    def __init__(self, d_in, d_out, rank):
        super().__init__()
        self.cola_a = nn.Parameter(torch.empty(d_in, rank))  # (d_in, r)
        self.cola_b = nn.Parameter(torch.empty(rank, d_out))  # (r, d_out)

    def forward(self, x):
        return F.silu(x @ self.cola_a) @ self.cola_b


class NanoCoLAForCausalLM(LlamaForCausalLM):
    config_class = NanoCoLAConfig

    def __init__(self, config):
        super().__init__(config)
        d, f, r = config.hidden_size, config.intermediate_size, config.rank
        for layer in self.model.layers:
            for name in ('q_proj', 'k_proj', 'v_proj', 'o_proj'):
                setattr(layer.self_attn, name, CoLALayer(d, d, r))
            layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj = CoLALayer(d, f, r), CoLALayer(d, f, r), CoLALayer(f, d, r)
            if config.only_lr_act:
                layer.mlp.act_fn = nn.Identity()
        self.post_init()

    def _init_weights(self, module):
        """Weights a checkpoint lacks: CoLA's init (A, B ~ N(0, 1) r^(-1/4) (d_in + d_out)^(-1/4)); Llama's for the rest."""
        if isinstance(module, CoLALayer):
            d_in, rank = module.cola_a.shape
            std = rank ** -0.25 * (d_in + module.cola_b.shape[1]) ** -0.25
            nn.init.normal_(module.cola_a, std=std)
            nn.init.normal_(module.cola_b, std=std)
        else:
            super()._init_weights(module)
