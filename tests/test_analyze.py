import json

import numpy as np
import pytest
import torch
from dataclasses import replace

from conftest import TINY, TINY_TRAIN
from helpers import run, train_log

from analyze import (along, barrier, barrier_between_models, dense_state, energy_rank, expected_sharpness, interpolate,
                     linear_cka, matrices, random_direction, spectrum)
from model import Transformer, load_checkpoint, model_from_checkpoint


def test_spectrum_statistics_of_known_singular_values():
    s = np.array([4.0, 2.0, 1.0, 1.0, 0.0])
    p = s[:4] / 8
    stats = spectrum(s)
    assert stats['rank'] == 4 and stats['spectral_norm'] == 4.0 and stats['spectral_gap'] == 0.5
    assert stats['effective_rank'] == pytest.approx(np.exp(-(p * np.log(p)).sum()))
    assert stats['stable_rank'] == pytest.approx(22 / 16)
    # energies 16, 20, 21, 22 of 22: 90% (19.8) needs 2 values, 95% (20.9) 3, 99% (21.78) 4
    assert (stats['rank_90'], stats['rank_95'], stats['rank_99']) == (2, 3, 4)
    U, _ = torch.linalg.qr(torch.randn(10, 5, dtype=torch.float64))
    V, _ = torch.linalg.qr(torch.randn(7, 5, dtype=torch.float64))
    matrix = U @ torch.diag(torch.tensor(s)) @ V.T  # the same singular values, through an SVD
    assert spectrum(torch.linalg.svdvals(matrix).numpy())['effective_rank'] == pytest.approx(stats['effective_rank'])
    assert energy_rank([1.0] * 10, 0.9) == 9


def test_linear_cka_is_one_on_itself_and_invariant_to_rotation_and_scaling():
    torch.manual_seed(0)
    X, Y = torch.randn(200, 16), torch.randn(200, 12)
    Q, _ = torch.linalg.qr(torch.randn(16, 16))
    assert linear_cka(X, X) == pytest.approx(1.0)
    assert linear_cka(X @ Q * 3.7, X) == pytest.approx(1.0)
    assert linear_cka(X @ Q, Y) == pytest.approx(linear_cka(X, Y)) and linear_cka(X, Y) < 0.5


class Quadratic(torch.nn.Module):
    """loss(theta) = 1/2 sum a_i theta_i^2, whose expected sharpness along d is mean_t 1/2 t^2 sum a_i d_i^2."""

    def __init__(self):
        super().__init__()
        self.theta = torch.nn.Parameter(torch.zeros(6))
        self.a = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])

    def loss(self, model):
        return float(0.5 * (self.a * self.theta.detach() ** 2).sum())


def test_sharpness_of_a_quadratic_and_the_landscape_leaves_the_weights_unchanged():
    q = Quadratic()
    d = torch.randn(6)
    ts = np.linspace(-0.5, 0.5, 7)
    losses = along(q, q.loss, [d], ts)
    curvature = float(0.5 * (q.a * d ** 2).sum())
    assert expected_sharpness(losses) == pytest.approx(curvature * np.mean(ts[4:] ** 2), rel=1e-5)
    model = Transformer(TINY)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    along(model, lambda m: 0.0, random_direction(model, torch.Generator().manual_seed(0), normalise=True), ts)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_interpolation_endpoints_are_the_checkpoints_losses():
    idx = torch.randint(0, 96, (4, 32))

    def loss_fn(model):
        with torch.no_grad():
            return model(idx, idx)[1].item()
    torch.manual_seed(0)
    first, second = Transformer(TINY).eval(), Transformer(TINY).eval()
    losses = interpolate(Transformer(TINY).eval(), first.state_dict(), second.state_dict(), loss_fn, 5)
    assert losses[0] == loss_fn(first) and losses[-1] == loss_fn(second)
    assert barrier([1.0, 3.0, 2.0]) == 1.5


def test_barriers_measure_the_bump_not_the_fall():
    assert barrier([3.0, 2.95, 2.9, 2.85, 2.8]) == pytest.approx(0.0)  # a straight fall: no barrier (was 0.10)
    assert barrier([3.0, 3.1, 2.8]) == pytest.approx(0.2)  # 0.2 above the line's 2.9
    assert barrier_between_models([2.0, 2.5, 2.2]) == pytest.approx(0.4)  # interior max over the endpoints' mean


def test_the_rank_of_colas_product_is_its_bottleneck_not_twice_it():
    torch.manual_seed(0)
    model = Transformer(replace(TINY, n_embd=128, intermediate_size=256, n_head=4, rank=32))
    product = matrices(model)["blocks.0.mlp.up_proj.A@B"].detach()  # 128 x 256 of rank 32, formed in float64
    assert spectrum(torch.linalg.svdvals(product).numpy(), 256)['rank'] == 32
    float32_product = (model.blocks[0].mlp.up_proj.A @ model.blocks[0].mlp.up_proj.B).detach()
    assert spectrum(torch.linalg.svdvals(float32_product.double()).numpy(), 256)['rank'] == 32  # the relative cut


def test_tsvd_is_measured_on_w_so_rotated_factors_of_the_same_w_change_nothing():
    torch.manual_seed(0)
    model = Transformer(replace(TINY, projection='tsvd'))
    before = {k: v.detach().clone() for k, v in matrices(model).items()}
    with torch.no_grad():
        for layer in [m for m in model.modules() if hasattr(m, 'S')]:
            Q, _ = torch.linalg.qr(torch.randn(layer.rank, layer.rank))
            layer.U.copy_(layer.U @ Q)
            layer.S.copy_(Q.T @ layer.S)  # U S V unchanged, the factors rotated
    after = matrices(model)
    assert max((after[k] - before[k]).norm().item() for k in before) < 1e-5
    twin = Transformer(replace(TINY, rank=0))
    twin.load_state_dict(dense_state(model))  # the same function as a full-rank model
    idx = torch.randint(0, 96, (2, 32))
    torch.testing.assert_close(twin.eval()(idx)[0], model.eval()(idx)[0], rtol=1e-4, atol=1e-5)


def test_an_elas_checkpoint_loads_with_the_sparsity_it_was_trained_in(data):
    common = [*TINY_TRAIN, '--data_dir=data', '--mlp=elas', '--elas_warmup_iters=5', '--eval_interval=3']
    run(data, 'train.py', *common, '--out_dir=elas_dense', '--max_iters=3')
    run(data, 'train.py', *common, '--out_dir=elas_sparse', '--max_iters=6')
    for name, sparse in (('elas_dense', False), ('elas_sparse', True)):
        model = model_from_checkpoint(load_checkpoint(str(data / name / 'ckpt.pt')))
        assert model.blocks[0].mlp.sparse is sparse


def test_analyze_py_end_to_end_on_two_tiny_runs(data):
    common = [*TINY_TRAIN, '--data_dir=data', '--max_iters=9', '--eval_interval=3']
    run(data, 'train.py', *common, '--out_dir=an_full', '--rank=0', '--keep_checkpoints')
    run(data, 'train.py', *common, '--out_dir=an_cola', '--keep_checkpoints')
    run(data, 'train.py', *common, '--out_dir=an_cola_plain')
    assert sorted(p.name for p in (data / 'an_cola').glob('ckpt_*.pt')) == ['ckpt_3.pt', 'ckpt_6.pt', 'ckpt_9.pt']
    assert train_log(data / 'an_cola') == train_log(data / 'an_cola_plain')  # keeping them changes nothing
    r = run(data, 'analyze.py', '--runs=an_full,an_cola', '--reference=an_full', '--out_dir=an', '--eval_tokens=1024',
            '--directions=2', '--grid=3', '--top_k=1', '--alphas=3', '--activation_tokens=256')
    results = json.load(open(data / 'an' / 'analysis.json'))['runs']
    full, cola = results
    assert full['similarity'][0]['cka'] == pytest.approx(1.0) and len(cola['similarity']) == 4  # embedding, 2 blocks, final norm
    assert {'q', 'down', 'q z', 'down z'} <= cola['activations'].keys() and cola['activations']['q z']['width'] == 16
    assert len(cola['updates']) == 2 and len(cola['interpolation']) == 2 and len(cola['landscape']['curves']) == 2
    assert cola['interpolation'][0]['losses'][-1] == pytest.approx(cola['interpolation'][1]['losses'][0])
    assert full['barrier_to_reference']['barrier'] == pytest.approx(0.0, abs=1e-9)  # a model with itself
    assert cola['barrier_to_reference'].startswith('not computed: CoLA-style factors')
    assert '| an_cola |' in r.stdout and (data / 'an' / 'analysis.md').exists()
    try:
        import matplotlib  # noqa: F401
        assert (data / 'an' / 'landscape.png').exists() and (data / 'an' / 'cka.png').exists()
    except ImportError:
        pass


def test_similarity_has_the_papers_relative_l2_and_the_top_k_directions_cover_embeddings():
    from analyze import similarity_of, singular_direction
    r = torch.tensor([[3.0, 4.0], [0.0, 1.0]])  # per-position norms 5 and 1: mean 3
    h = r + torch.tensor([[1.0, 0.0], [0.0, 2.0]])  # per-position L2 distances 1 and 2: mean 1.5
    s = similarity_of(0, h, r)
    assert s['mean_l2'] == pytest.approx(1.5) and s['relative_l2'] == pytest.approx(0.5)
    model = Transformer(TINY)
    direction = dict(zip([n for n, _ in model.named_parameters()], singular_direction(model, 1)))
    assert direction['tok_emb.weight'] is not None and direction['lm_head.weight'] is not None
    assert direction['norm.weight'] is None


def test_downstream_prediction_shows_when_geometry_explains_what_the_loss_does_not():
    from analyze import downstream_prediction, leave_one_out_error
    rng = np.random.default_rng(0)
    x = rng.normal(size=12)
    assert leave_one_out_error(x[:, None], 2 * x + 1) == pytest.approx(0.0, abs=1e-9)  # a line is predicted exactly
    results = [{'val_loss': float(rng.normal()), 'landscape': {'sharpness_mean': float(s)},
                'weights': {'effective_rank': float(rng.normal())}, 'downstream': {'task': 0.5 + 0.1 * float(s)}}
               for s in rng.normal(size=12)]  # the accuracy follows sharpness, not the loss
    p = downstream_prediction(results)['task']
    assert p['runs'] == 12 and p['error_loss_and_geometry'] < 1e-9 < p['error_loss_only']
    assert downstream_prediction(results[:5]) is None  # too few runs to say


def test_an_empty_cell_of_the_report_says_why():
    import analyze
    bare = {'run': 'out/plain', 'iter': 10, 'val_loss': 2.0, 'checkpoints': 0,
            'weights': {'effective_rank': 5.0, 'stable_rank': 2.0, 'spectral_gap': 0.1, 'above_0.1': 3.0}}
    report = analyze.markdown([bare])
    assert '| plain | 10 | 2.0000 | off | off | off | no trajectory: train with keep_checkpoints=True | no --reference | ' \
           'no scores: run evaluate.py on it |' in report
    assert '| n/a (no factors) | no trajectory: train with keep_checkpoints=True |' in report
    assert ' - ' not in report and '| - |' not in report
