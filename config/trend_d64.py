# The size trend's smallest point: full-rank, CoLA and CoLA-M at d = 64 (r = 16, 2 layers, heads of 32), on the
# study's data, at the study's 10.3 tokens per full-rank non-embedding parameter (100,672: 254 steps of 4,096 tokens),
# each at its own full-horizon learning rate (the sweep as compare.py's), 3 seeds. d = 128 is compare.py's own study.
# 19 runs, 7 minutes of training on 2 CPU cores (measured 2026-12-05).
# python compare.py config/trend_d64.py   (then python compare.py config/trend.py for the table and plot)
out_dir = 'out-trend-d64'
n_head, n_embd, intermediate_size, rank = 2, 64, 176, 16  # SwiGLU 8/3 d rounded up to a multiple of 8, as 344 at d = 128
max_iters = 254
eval_interval = 25
methods = ('full-rank', 'cola', 'cola-m')
keep_checkpoints = False
