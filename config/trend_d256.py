# The size trend's largest point: full-rank, CoLA and CoLA-M at d = 256 (r = 64, 2 layers, heads of 32), on the
# study's data, at the study's 10.3 tokens per full-rank non-embedding parameter (1,582,336: 3,997 steps of 4,096
# tokens), each at its own full-horizon learning rate. What 2 cores allow: a grid of three rates (the study's four
# less 1.6e-2), then its best / and * sqrt(2), one seed; a winner at the edge of the rates tried is marked as such.
# python compare.py config/trend_d256.py   (then python compare.py config/trend.py for the table and plot)
# Measured on 2 cores (2026-12-05): full-rank's 5 runs 2 h 13 min, CoLA's 5 runs 1 h 41 min, CoLA-M's one 24 min,
# 4 h 18 min in all. The first grid, (2e-3, 4e-3), put full-rank's best at its top edge (5.66e-3); this grid extended
# it, every finished run reused, and full-rank's best moved to 8e-3, inside the rates tried.
out_dir = 'out-trend-d256'
n_head, n_embd, intermediate_size, rank = 8, 256, 688, 64  # SwiGLU 8/3 d rounded up to a multiple of 8
max_iters = 3997
eval_interval = 400
sweep_lrs = (2e-3, 4e-3, 8e-3)
seeds = (1,)
methods = ('full-rank', 'cola', 'cola-m')
keep_checkpoints = False
