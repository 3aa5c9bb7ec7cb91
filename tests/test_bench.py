import json
import os

import pytest
import torch
import torch.nn.functional as F
from helpers import ROOT, run

from bench import count_flops
from model import Transformer


def test_flop_counter_counts_a_plain_matmul():  # the counting helper against a count by hand
    class Matmul(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(8, 5))

        def forward(self, idx, targets):
            y = F.one_hot(idx, 8).float() @ self.w  # (B, T, 5)
            return y, y.sum()

    forward, backward = count_flops(Matmul(), torch.zeros(2, 3, dtype=torch.long))
    assert forward == 2 * 6 * 8 * 5 and backward == 2 * 6 * 8 * 5  # no gradient for the one-hot input


def test_bench_runs_on_a_tiny_cpu_config_and_reports_consistent_counts():
    args = ['--n_layer=1', '--n_head=2', '--n_embd=64', '--intermediate_size=128', '--rank=16', '--vocab_size=256',
            '--batch_size=2', '--seq_len=32', '--steps=2', '--warmup=1']
    r = run(ROOT, 'bench.py', *args, '--as_json')
    report = json.loads(r.stdout)
    rows = report['rows']
    assert report['shape']['n_embd'] == 64 and report['shape']['vocab_size'] == 256  # the shapes measured
    assert 'profiler' not in r.stderr  # the profiler's own lines are muted
    d, f, r_, V = 64, 128, 16, 256
    embeddings = 2 * V * d
    assert rows['full-rank']['params_M'] * 1e6 == 4 * d * d + 3 * d * f + 2 * d + d + embeddings
    assert rows['cola']['params_M'] * 1e6 == 11 * d * r_ + 3 * r_ * f + 2 * d + d + embeddings
    h = int(1.5 * f) // 4 * 4  # ELAS's hidden width
    assert rows['dlr']['params_M'] == rows['cola']['params_M']  # DLR's residual is a fixed buffer
    assert rows['elas']['params_M'] * 1e6 == 8 * d * r_ + 2 * r_ * (d + h) + 2 * d + d + embeddings
    assert rows['elas']['sparse_flops_saved_per_token'] == h * r_ and rows['cola']['sparse_flops_saved_per_token'] == 0
    assert rows['tsvd']['params_M'] * 1e6 == 7 * r_ * r_ + 11 * d * r_ + 3 * r_ * f + 2 * d + d + embeddings  # U, S, V
    for row in rows.values():
        assert row['flops_per_token'] == row['flops_per_token_analytic'] and row['tokens_per_s'] > 0
    assert rows['full-rank + full ckpt']['activation_bytes_per_token_per_layer'] == 4 * d
    assert rows['cola-m']['activation_bytes_per_token_per_layer'] == 4 * (2 * d + 7 * r_)
    assert rows['cola-m']['recompute_flops_per_token'] < rows['full-rank + full ckpt']['recompute_flops_per_token']
    # GaLore / Fira, fp32: per projection (m out x n in) two moments r x max(m, n) and the projector r x min(m, n);
    # the other parameters AdamW's two moments; Fira one norm more per projection. AdamW: two moments, and a step
    # per tensor (12 tensors: embedding, lm_head, final norm; per block 2 norms and 7 projections)
    full = rows['full-rank']['params_M'] * 1e6
    shapes = [(d, d)] * 4 + [(f, d)] * 2 + [(d, f)]
    projected = sum(m * n for m, n in shapes)
    low_rank = 4 * sum(r_ * (2 * max(m, n) + min(m, n)) for m, n in shapes) + 8 * (full - projected)
    assert rows['galore']['optimizer_state_bytes_per_param'] * full == pytest.approx(low_rank)
    assert rows['fira']['optimizer_state_bytes_per_param'] * full == pytest.approx(low_rank + 4 * 7)
    assert rows['full-rank']['optimizer_state_bytes_per_param'] * full == pytest.approx(8 * full + 4 * 12)
    table = run(ROOT, 'bench.py', *args).stdout
    assert table.count('\n| ') == 14 and 'Against the paper:' in table and 'throughput: CoLA' in table
    assert 'GaLore / Fira' in table


def test_generation_benchmark_compares_cola_with_full_rank():
    r = run(ROOT, 'bench.py', '--generation', '--n_layer=1', '--n_embd=64', '--n_head=2', '--intermediate_size=128',
            '--rank=16', '--seq_len=64', '--new_tokens=8', '--batch_size=1')
    assert '| full-rank |' in r.stdout and '| cola |' in r.stdout and 'less memory for weights + KV cache' in r.stdout


def test_params_table_lists_every_config_with_its_vocabulary():
    r = run(ROOT, 'bench.py', '--table=params')
    rows = [line for line in r.stdout.splitlines() if line.startswith('| config/')]
    assert len(rows) == 10 and all('| 50304 |' in row for row in rows)
    assert '| config/cola_1b.py | 2048 | 5461 | 32 | 24 | 512 | 50304 | 684.3 | 478.2 |' in rows


@pytest.mark.parametrize('rank,mode', [(0, 'none'), (1024, 'none'), (1024, 'cola-m')])
def test_the_roofline_models_compute_bound_matmuls_at_the_models_own_flop_count(rank, mode):
    """At the 7b widths every GEMM is compute-bound, so the model's matmul and attention time is the model's training
    FLOPs (recomputation included, model.flops_per_token) at the dense rate."""
    from bench import GPUS, config_shape, roofline_step
    shape, _ = config_shape(os.path.join(ROOT, 'config', 'cola_7b.py'), rank=rank, checkpointing=mode, vocab_size=50304)
    with torch.device('meta'):
        flops = Transformer(shape).flops_per_token(shape.block_size)
    matmul_s, elementwise_s = roofline_step(shape, 8 * 256, 'h100', mode)
    assert matmul_s == pytest.approx(flops / GPUS['h100'][0], rel=0.01) and elementwise_s > 0
