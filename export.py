"""
Export a train.py run as a Hugging Face folder, or import one.

    python export.py --out_dir=out-full-130m --export_dir=hf-full-130m
    # then: transformers.AutoModelForCausalLM.from_pretrained('hf-full-130m')   (a CoLA run: trust_remote_code=True)
    python export.py --import_dir=hf-llama --out_dir=out-from-llama --encoding=gpt2   # the other way
    # then: python train.py ... --out_dir=out-from-llama --init_from=resume  (training starts from those weights)

nanoCoLA's LLaMA is Hugging Face's layer for layer (RMSNorm, RoPE rotating half of each head, SwiGLU, no biases,
untied embeddings), so the weights map one to one:
- a run whose every projection is one matrix becomes a plain LlamaForCausalLM that transformers loads with no custom
  code: full-rank (AdamW, GaLore, Fira), and the methods whose layers fold into one matrix (ReLoRA's W + s B A,
  SLTrain's s B A + S, TSVD's (U S V)^T);
- a CoLA run (CoLA-M the same weights, DLR folded into B) is written in the official CoLA code's layout: its
  ColaConfig (model_type 'cola', rank, only_lr_act) and each projection's cola_a (A, d_in x r) and cola_b (B, r x d_out),
  which the official ColaForCausalLM.from_pretrained loads, with our modeling code beside it (modeling_nanocola.py,
  named in config.json's auto_map), which AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True) loads.
  ELAS and Low-Rank have no Hugging Face layout and are refused.
Written: config.json, model.safetensors (float32, the weights as trained) and the run's encoding as a transformers
tokenizer (hf_tokenizer: the same token ids).

The other way, --import_dir: a Llama or official CoLA folder (config.json, model.safetensors) becomes out_dir/ckpt.pt,
a checkpoint at step 0 with a fresh AdamW state, which train.py continues with --init_from=resume and the folder's
shapes; its encoding is the folder's tokenizer if it has one, else --encoding (the data's, e.g. gpt2).
"""

import json
import os
import shutil
import sys
import tempfile

import torch

from configurator import configure, public_settings
from methods.lowrank import LowRankLinear
from model import (CoLALinear, ModelConfig, RMSNorm, Transformer, describe_checkpoint, load_checkpoint,
                   model_from_checkpoint)
from shards import get_encoding, write_durably

# ----------------------------------------------------------------------------- config
out_dir = 'out'  # the run whose checkpoint is exported
checkpoint_name = 'ckpt.pt'  # 'ckpt.pt' (the latest state) or 'best.pt'
export_dir = ''  # the folder to write; it must not exist yet or be empty
import_dir = ''  # instead: a Hugging Face LlamaForCausalLM folder to make out_dir/ckpt.pt from
encoding = ''  # with import_dir: the encoding of the data it will train on ('gpt2', 'byte'; '' = its own tokenizer)
data_dir = 'data/c4'  # with import_dir: the token shards the printed train.py command trains on
max_iters = 1000  # with import_dir: the steps the printed train.py command trains


def llama_modules(config):
    """nanoCoLA's module names -> Hugging Face Llama's (and the official CoLA code's, which keeps Llama's), layer for
    layer; a module's tensors are '.weight', or '.cola_a' (A, d_in x r) and '.cola_b' (B, r x d_out) for CoLA's."""
    names = {'tok_emb': 'model.embed_tokens', 'norm': 'model.norm', 'lm_head': 'lm_head'}
    for i in range(config.n_layer):
        ours, theirs = f'blocks.{i}.', f'model.layers.{i}.'
        names[ours + 'attn_norm'], names[ours + 'mlp_norm'] = theirs + 'input_layernorm', theirs + 'post_attention_layernorm'
        names |= {f'{ours}attn.{p}': f'{theirs}self_attn.{p}' for p in ('q_proj', 'k_proj', 'v_proj', 'o_proj')}
        names |= {f'{ours}mlp.{p}': f'{theirs}mlp.{p}' for p in ('gate_proj', 'up_proj', 'down_proj')}
    return names


def one_matrix(module):
    """A module's weight as one matrix (nn.Linear's (d_out, d_in) layout; ReLoRA, SLTrain and TSVD formed from their
    parts), or None for CoLA-style factors."""
    if hasattr(module, 'dense_weight'):
        return module.dense_weight()
    return module.weight if isinstance(module, (torch.nn.Linear, torch.nn.Embedding, RMSNorm)) else None


def hf_state(model):
    """The Hugging Face state dict of a nanoCoLA model: Llama's, or the official CoLA code's for CoLA layers (DLR
    folded first); a one-line exit for what neither holds."""
    if model.config.mlp != 'swiglu' or any(isinstance(m, LowRankLinear) for m in model.modules()):
        raise SystemExit("ELAS's MLP and Low-Rank's linear factors are neither Llama's nor the official CoLA code's "
                         "layers: export.py takes full-rank, GaLore, Fira, ReLoRA, SLTrain, TSVD, CoLA, CoLA-M and DLR runs")
    model.fold_dlr()
    state = {}
    for ours, theirs in llama_modules(model.config).items():
        module = model.get_submodule(ours)
        if isinstance(module, CoLALinear):
            state[theirs + '.cola_a'], state[theirs + '.cola_b'] = module.A, module.B
        else:
            state[theirs + '.weight'] = one_matrix(module)
    return {k: v.detach().float().contiguous() for k, v in state.items()}


def llama_settings(hf, folder):
    """ModelConfig's settings from a Llama's or an official CoLA model's config.json, as transformers 4 writes it
    (rope_theta, rope_scaling at the top) or 5 (both in rope_parameters); a setting nanoCoLA's model lacks (biases,
    rope scaling, grouped KV heads, tied embeddings, another head_dim or activation) is refused in one line naming
    it, never dropped."""
    rope, scaling = hf.get('rope_parameters') or {}, hf.get('rope_scaling') or {}
    heads, width = hf.get('num_attention_heads'), hf.get('hidden_size')
    lacks = [  # (setting, its value, what nanoCoLA's model has instead), for each value the model cannot take
        ('model_type', hf.get('model_type'), "'llama' or 'cola'", hf.get('model_type') in ('llama', 'cola')),
        ('num_key_value_heads', hf.get('num_key_value_heads'), f'one KV head per query head ({heads})',
         hf.get('num_key_value_heads', heads) == heads),
        ('tie_word_embeddings', hf.get('tie_word_embeddings'), 'an output layer of its own', not hf.get('tie_word_embeddings')),
        ('hidden_act', hf.get('hidden_act'), "'silu'", hf.get('hidden_act', 'silu') == 'silu'),
        ('attention_bias', hf.get('attention_bias'), 'no biases', not hf.get('attention_bias')),
        ('mlp_bias', hf.get('mlp_bias'), 'no biases', not hf.get('mlp_bias')),
        ('rope_scaling', scaling, 'plain RoPE', scaling.get('rope_type', scaling.get('type', 'default')) == 'default'),
        ('rope_parameters', rope, "plain RoPE (rope_type 'default')", rope.get('rope_type', 'default') == 'default'),
        ('head_dim', hf.get('head_dim'), f'hidden_size / num_attention_heads ({width} / {heads})',
         hf.get('head_dim') in (None, width // heads if width and heads else None)),
    ]
    for setting, value, instead, fits in lacks:
        if not fits:
            raise SystemExit(f"import_dir={folder!r}: {setting}={value!r}: nanoCoLA's model has {instead}, so it "
                             f"cannot compute this model's function")
    return dict(vocab_size=hf['vocab_size'], block_size=hf.get('max_position_embeddings', 2048),
                n_layer=hf['num_hidden_layers'], n_head=heads, n_embd=width, intermediate_size=hf['intermediate_size'],
                rank=hf.get('rank', 0) if hf['model_type'] == 'cola' else 0, only_lr_act=hf.get('only_lr_act', False),
                norm_eps=hf.get('rms_norm_eps', 1e-6), rope_theta=rope.get('rope_theta', hf.get('rope_theta', 10000.0)))


def import_llama(folder):
    """(a Transformer with a Llama's or an official CoLA model's weights, its encoding or None), or a one-line exit."""
    from safetensors.torch import load_file
    try:
        hf = json.load(open(os.path.join(folder, 'config.json')))
        weights = load_file(os.path.join(folder, 'model.safetensors'))
    except (OSError, ValueError) as e:
        raise SystemExit(f"import_dir={folder!r}: expected a Hugging Face folder with config.json and "
                         f"model.safetensors ({type(e).__name__})") from None
    try:
        config = ModelConfig(**llama_settings(hf, folder))
    except (KeyError, TypeError, ValueError) as e:  # a setting missing, or one ModelConfig refuses
        raise SystemExit(f"import_dir={folder!r}: config.json does not describe a model nanoCoLA can build "
                         f"({type(e).__name__}: {e})") from None
    model = Transformer(config)
    names = {}  # ours -> theirs, tensor by tensor
    for name, theirs in llama_modules(config).items():  # as hf_state writes them
        if isinstance(model.get_submodule(name), CoLALinear):  # the official CoLA layer's two factors
            names[name + '.A'], names[name + '.B'] = theirs + '.cola_a', theirs + '.cola_b'
        else:
            names[name + '.weight'] = theirs + '.weight'
    missing = set(names.values()) - weights.keys()
    if missing:
        raise SystemExit(f"import_dir={folder!r}: model.safetensors lacks {sorted(missing)[0]} (and {len(missing) - 1} more)")
    model.load_state_dict({ours: weights[theirs] for ours, theirs in names.items()})
    tokenizer = os.path.exists(os.path.join(folder, 'tokenizer.json')) or os.path.exists(os.path.join(folder, 'tokenizer.model'))
    return model, hf.get('nanocola_encoding') or ('hf:' + os.path.abspath(folder) if tokenizer else None)


def is_cola(model):
    return any(isinstance(m, CoLALinear) for m in model.modules())


def hf_config(model):
    """config.json of the same architecture: transformers' LlamaConfig, or the official CoLA code's ColaConfig."""
    config = model.config
    cola = {'architectures': ['ColaForCausalLM'], 'model_type': 'cola', 'rank': config.rank,
            'only_lr_act': config.only_lr_act, 'auto_map': {'AutoConfig': 'modeling_nanocola.NanoCoLAConfig',
                                                            'AutoModelForCausalLM': 'modeling_nanocola.NanoCoLAForCausalLM'}
            } if is_cola(model) else {}
    return {'architectures': ['LlamaForCausalLM'], 'model_type': 'llama', 'vocab_size': config.vocab_size,
            'hidden_size': config.n_embd, 'intermediate_size': config.intermediate_size,
            'num_hidden_layers': config.n_layer, 'num_attention_heads': config.n_head,
            'num_key_value_heads': config.n_head, 'hidden_act': 'silu', 'max_position_embeddings': config.block_size,
            'rms_norm_eps': config.norm_eps, 'rope_theta': config.rope_theta, 'tie_word_embeddings': False,
            'attention_bias': False, 'mlp_bias': False, 'torch_dtype': 'float32', **cola}


def hf_tokenizer(encoding):
    """The run's encoding as a transformers tokenizer giving the same tokens: the paper's recipe's own tokenizer;
    GPT-2's BPE from tiktoken's files (its vocab.bpe is GPT-2's merges.txt, its encoder.json GPT-2's vocab.json); the
    byte encoding as byte-level BPE without merges (token b is byte b, 256 the end of text)."""
    from transformers import GPT2TokenizerFast, PreTrainedTokenizerFast
    if encoding.startswith('hf:'):  # its tokenizer.json as it is (transformers 5's T5 class would change it)
        enc = get_encoding(encoding)
        eos, pad = (enc.tokenizer.id_to_token(i) for i in (enc.eot_token, enc.pad_token))
        return PreTrainedTokenizerFast(tokenizer_object=enc.tokenizer, eos_token=eos, pad_token=pad)
    if encoding == 'gpt2':
        from tiktoken.load import read_file_cached
        get_encoding('gpt2')  # tiktoken's files are cached (or a one-line exit saying how to get them offline)
        url = 'https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/'
        with tempfile.TemporaryDirectory() as folder:
            for name, ours in [('vocab.bpe', 'merges.txt'), ('encoder.json', 'vocab.json')]:
                with open(os.path.join(folder, ours), 'wb') as f:
                    f.write(read_file_cached(url + name))
            return GPT2TokenizerFast(os.path.join(folder, 'vocab.json'), os.path.join(folder, 'merges.txt'),
                                     split_special_tokens=True)  # '<|endoftext|>' in a text is text, as in tiktoken
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    shown = [*range(ord('!'), ord('~') + 1), *range(ord('¡'), ord('¬') + 1), *range(ord('®'), ord('ÿ') + 1)]
    hidden = [b for b in range(256) if b not in shown]  # byte-level BPE's symbol of byte b: itself where printable,
    chars = [chr(b) if b in shown else chr(256 + hidden.index(b)) for b in range(256)]  # else 256, 257, ... in order
    tokenizer = Tokenizer(models.BPE(vocab={c: b for b, c in enumerate(chars)}, merges=[]))
    tokenizer.pre_tokenizer, tokenizer.decoder = byte_level, decoders.ByteLevel()
    tokenizer.add_special_tokens(['<|endoftext|>'])  # id 256
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token='<|endoftext|>', split_special_tokens=True)


def write_import():
    """out_dir/ckpt.pt from import_dir: what train.py --init_from=resume reads, at step 0."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
    model, own_encoding = import_llama(import_dir)
    enc = encoding or own_encoding
    if not enc:
        raise SystemExit(f"import_dir={import_dir!r} holds no tokenizer: give --encoding= the data's ('gpt2' or 'byte')")
    path = os.path.join(out_dir, 'ckpt.pt')
    if os.path.exists(path):
        raise SystemExit(f"{path} exists: nothing is overwritten; give a new out_dir")
    optimizer = model.configure_optimizers(0.0, 1e-3, (0.9, 0.999), 'cpu')  # train.py applies its own settings
    state = {'model': model.state_dict(), 'optimizer': get_optimizer_state_dict(model, optimizer),
             'model_config': vars(model.config), 'config': {'init_from': import_dir}, 'encoding': enc,
             'iter_num': 0, 'data_position': 0, 'flops_spent': 0, 'best_val_loss': float('inf'),
             'rng': {'cpu': torch.get_rng_state(), 'cuda': None}}
    os.makedirs(out_dir, exist_ok=True)
    write_durably(path, lambda f: torch.save(state, f))
    c = model.config
    print(f"wrote {path} from {import_dir}; train it on {data_dir}/ (whose encoding must be {enc}) with:\n"
          f"python train.py --out_dir={out_dir} --init_from=resume --data_dir={data_dir} --max_iters={max_iters} "
          f"--lr_decay_iters={max_iters} --warmup_iters={max_iters // 10} --rank={c.rank} --only_lr_act={c.only_lr_act} "
          f"--n_layer={c.n_layer} --n_head={c.n_head} --n_embd={c.n_embd} --intermediate_size={c.intermediate_size} "
          f"--vocab_size={c.vocab_size} --block_size={c.block_size} --norm_eps={c.norm_eps} --rope_theta={c.rope_theta}\n"
          f"(add --batch_size, --learning_rate and the rest of your recipe: train.py's defaults are CoLA-60M's)")


if __name__ == '__main__':
    globals().update(configure(public_settings(globals()), sys.argv[1:]))
    if import_dir:
        write_import()
        sys.exit(0)
    if not export_dir:
        raise SystemExit("export_dir='': give --export_dir=FOLDER, a new folder for the Hugging Face files")
    if os.path.exists(export_dir) and (not os.path.isdir(export_dir) or os.listdir(export_dir)):
        raise SystemExit(f"export_dir={export_dir!r} already exists and is not an empty folder: nothing is overwritten; "
                         f"give a new folder")
    path = os.path.join(out_dir, checkpoint_name)
    checkpoint = load_checkpoint(path)
    print('exporting ' + describe_checkpoint(checkpoint, path), file=sys.stderr)
    model = model_from_checkpoint(checkpoint, path=path)
    state = hf_state(model)
    from safetensors.torch import save as safetensors_bytes
    os.makedirs(export_dir, exist_ok=True)
    write_durably(os.path.join(export_dir, 'model.safetensors'), lambda f: f.write(safetensors_bytes(state, {'format': 'pt'})))
    own = {'nanocola_encoding': checkpoint['encoding']} if checkpoint['encoding'] in ('byte', 'gpt2') else {}  # for import
    write_durably(os.path.join(export_dir, 'config.json'),
                  lambda f: f.write(json.dumps(hf_config(model) | own, indent=1).encode()))
    hf_tokenizer(checkpoint['encoding']).save_pretrained(export_dir)
    if is_cola(model):  # our modeling code travels with the weights
        shutil.copyfile(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'modeling_nanocola.py'),
                        os.path.join(export_dir, 'modeling_nanocola.py'))
    loads = (f"transformers.AutoModelForCausalLM.from_pretrained({export_dir!r})" if not is_cola(model) else
             f"AutoModelForCausalLM.from_pretrained({export_dir!r}, trust_remote_code=True), or the official CoLA "
             f"code's ColaForCausalLM")
    print(f"wrote {export_dir}/ ({hf_config(model)['architectures'][0]}, "
          f"{sum(t.numel() for t in state.values()) / 1e6:.2f}M parameters): {loads}")
