"""
Export a train.py run as a Hugging Face folder that transformers loads with no custom code.

    python export.py --out_dir=out-full-130m --export_dir=hf-full-130m
    # then: transformers.AutoModelForCausalLM.from_pretrained('hf-full-130m')

A run whose every projection is one matrix becomes a plain LlamaForCausalLM: full-rank (AdamW, GaLore, Fira), and
the methods whose layers fold into one matrix after training (ReLoRA's W + s B A, SLTrain's s B A + S, TSVD's
(U S V)^T). Written: config.json, model.safetensors (float32, the weights as trained) and, when the run's encoding is
a Hugging Face tokenizer (the paper's recipe), its tokenizer files. nanoCoLA's LLaMA is Hugging Face's: RMSNorm,
RoPE rotating half of each head, SwiGLU, no biases, untied embeddings, so the weights map one to one.

CoLA-style runs (CoLA, CoLA-M, DLR, Low-Rank, ELAS) are refused for now: a bottleneck silu(x A) B is not a Llama
layer, and their export (our modeling code, and the official CoLA layout) is not written yet.
"""

import json
import os
import sys

import torch

from configurator import configure, public_settings
from model import describe_checkpoint, load_checkpoint, model_from_checkpoint
from shards import get_encoding, write_durably

# ----------------------------------------------------------------------------- config
out_dir = 'out'  # the run whose checkpoint is exported
checkpoint_name = 'ckpt.pt'  # 'ckpt.pt' (the latest state) or 'best.pt'
export_dir = ''  # the folder to write; it must not exist yet or be empty


def dense_weight(module):
    """A projection as one (d_out, d_in) matrix (nn.Linear's layout), or None where it is not one."""
    if isinstance(module, torch.nn.Linear):
        return module.weight
    return module.dense_weight().float() if hasattr(module, 'dense_weight') else None


def llama_state(model):
    """Hugging Face LlamaForCausalLM's state dict of a nanoCoLA model, or a one-line exit naming what does not fit."""
    config = model.config
    if config.mlp != 'swiglu' or config.only_lr_act:  # ELAS's squared-ReLU MLP, or SwiGLU without its SiLU
        raise SystemExit("this run's layers are CoLA-style (a bottleneck or ELAS's MLP), not Llama's: their export is "
                         "not written yet; export.py takes full-rank, GaLore, Fira, ReLoRA, SLTrain and TSVD runs")
    state = {'model.embed_tokens.weight': model.tok_emb.weight, 'model.norm.weight': model.norm.weight,
             'lm_head.weight': model.lm_head.weight}
    for i, block in enumerate(model.blocks):
        prefix = f'model.layers.{i}.'
        state[prefix + 'input_layernorm.weight'] = block.attn_norm.weight
        state[prefix + 'post_attention_layernorm.weight'] = block.mlp_norm.weight
        for name in ('q_proj', 'k_proj', 'v_proj', 'o_proj'):
            state[f'{prefix}self_attn.{name}.weight'] = dense_weight(getattr(block.attn, name))
        for name in ('gate_proj', 'up_proj', 'down_proj'):
            state[f'{prefix}mlp.{name}.weight'] = dense_weight(getattr(block.mlp, name))
    if any(w is None for w in state.values()):
        raise SystemExit("this run's layers are CoLA-style factors, not one matrix each: their export is not written "
                         "yet; export.py takes full-rank, GaLore, Fira, ReLoRA, SLTrain and TSVD runs")
    return {k: v.detach().float().contiguous() for k, v in state.items()}


def llama_config(config):
    """config.json of the same architecture, for transformers' LlamaConfig."""
    return {'architectures': ['LlamaForCausalLM'], 'model_type': 'llama', 'vocab_size': config.vocab_size,
            'hidden_size': config.n_embd, 'intermediate_size': config.intermediate_size,
            'num_hidden_layers': config.n_layer, 'num_attention_heads': config.n_head,
            'num_key_value_heads': config.n_head, 'hidden_act': 'silu', 'max_position_embeddings': config.block_size,
            'rms_norm_eps': config.norm_eps, 'rope_theta': config.rope_theta, 'tie_word_embeddings': False,
            'attention_bias': False, 'mlp_bias': False, 'torch_dtype': 'float32'}


if __name__ == '__main__':
    globals().update(configure(public_settings(globals()), sys.argv[1:]))
    if not export_dir:
        raise SystemExit("export_dir='': give --export_dir=FOLDER, a new folder for the Hugging Face files")
    if os.path.exists(export_dir) and (not os.path.isdir(export_dir) or os.listdir(export_dir)):
        raise SystemExit(f"export_dir={export_dir!r} already exists and is not an empty folder: nothing is overwritten; "
                         f"give a new folder")
    path = os.path.join(out_dir, checkpoint_name)
    checkpoint = load_checkpoint(path)
    print('exporting ' + describe_checkpoint(checkpoint, path), file=sys.stderr)
    model = model_from_checkpoint(checkpoint, path=path)
    state = llama_state(model)
    from safetensors.torch import save as safetensors_bytes
    os.makedirs(export_dir, exist_ok=True)
    write_durably(os.path.join(export_dir, 'model.safetensors'), lambda f: f.write(safetensors_bytes(state, {'format': 'pt'})))
    write_durably(os.path.join(export_dir, 'config.json'),
                  lambda f: f.write(json.dumps(llama_config(model.config), indent=1).encode()))
    if checkpoint['encoding'].startswith('hf:'):  # the paper's recipe: the tokenizer travels with the weights
        get_encoding(checkpoint['encoding']).tokenizer.save_pretrained(export_dir)
    print(f"wrote {export_dir}/ (LlamaForCausalLM, {sum(t.numel() for t in state.values()) / 1e6:.2f}M parameters): "
          f"transformers.AutoModelForCausalLM.from_pretrained({export_dir!r})")
