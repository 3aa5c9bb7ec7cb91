import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY, TINY_TRAIN
from helpers import run

from model import CoLALinear, ModelConfig, Transformer, load_checkpoint

DLR = replace(TINY, dlr_alpha=1.0)
ELAS = replace(TINY, mlp='elas')


def build(config, seed=0):
    torch.manual_seed(seed)
    return Transformer(config)


@pytest.mark.parametrize('d_in,d_out,rank', [(40, 96, 16), (40, 100, 16), (40, 1376 // 16, 16), (40, 10, 16)])
def test_dlr_layer_equals_the_formula_in_float64(d_in, d_out, rank):
    torch.manual_seed(0)
    layer = CoLALinear(d_in, d_out, rank, fused=False, dlr_alpha=0.7).double()
    x = torch.randn(3, 5, d_in, dtype=torch.float64)
    s = F.silu(x @ layer.A.detach())  # (3, 5, r)
    K = math.ceil(d_out / rank)  # d_out < r: K = 1
    expand = torch.stack([s[..., o // K] for o in range(d_out)], dim=-1)  # column o copies latent o // K
    expected = s @ layer.B.detach() + 0.7 / math.sqrt(K) * expand
    torch.testing.assert_close(layer(x), expected, rtol=1e-6, atol=1e-7)  # the residual is built in fp32


def test_dlr_at_d_out_1376_and_rank_128_uses_126_latents():
    layer = CoLALinear(8, 1376, 128, dlr_alpha=1.0)
    used = (layer.dlr_residual != 0).any(dim=1)
    assert used.sum() == 126 and layer.dlr_residual.max() == pytest.approx(1 / math.sqrt(11))


def test_dlr_leaves_b_gradient_as_colas_and_scope_picks_the_layers():
    torch.manual_seed(0)
    plain, dlr = CoLALinear(24, 40, 8, fused=False), CoLALinear(24, 40, 8, fused=False, dlr_alpha=1.0)
    dlr.load_state_dict({**plain.state_dict(), 'dlr_residual': dlr.dlr_residual})
    x, dy = torch.randn(6, 24), torch.randn(6, 40)
    plain(x).backward(dy)
    dlr(x).backward(dy)
    torch.testing.assert_close(dlr.B.grad, plain.B.grad)  # dL/dB = silu(z)^T dy either way
    attn_only = build(replace(DLR, dlr_scope='attn'))
    assert attn_only.blocks[0].attn.q_proj.dlr_residual is not None and attn_only.blocks[0].mlp.up_proj.dlr_residual is None


def test_folding_dlr_keeps_the_logits_and_gives_colas_names_and_counts():
    model, cola = build(DLR).eval(), build(TINY)
    idx = torch.randint(0, 96, (2, 32))
    before, _ = model(idx)
    model.fold_dlr()
    after, _ = model(idx)
    torch.testing.assert_close(after, before, rtol=0, atol=1e-5)
    assert list(model.state_dict()) == list(cola.state_dict()) and model.num_params() == cola.num_params()
    assert model.config == TINY


def test_a_dlr_checkpoint_cannot_be_loaded_into_a_cola_model_by_mistake():
    with pytest.raises(RuntimeError, match='Unexpected key.*dlr_residual'):
        build(TINY).load_state_dict(build(DLR).state_dict())


def test_a_dlr_checkpoint_samples_the_same_greedy_tokens_after_folding(data):
    run(data, 'train.py', *TINY_TRAIN, '--data_dir=data', '--dlr_alpha=1.0', '--out_dir=dlr', '--max_iters=10',
        '--eval_interval=10')
    checkpoint = load_checkpoint(str(data / 'dlr' / 'ckpt.pt'))
    unfolded = Transformer(ModelConfig(**checkpoint['model_config'])).eval()
    unfolded.load_state_dict(checkpoint['model'])
    prompt = 'the cat sees'
    idx = torch.tensor([list(prompt.encode())])
    expected = bytes(t for t in unfolded.generate(idx, 30, temperature=0)[0].tolist() if t < 256).decode(errors='replace')
    r = run(data, 'sample.py', '--out_dir=dlr', f'--start={prompt}', '--temperature=0', '--num_samples=1',
            '--max_new_tokens=30', '--device=cpu', '--dtype=float32')
    assert r.stdout.split('---------------')[0].rstrip('\n') == expected
