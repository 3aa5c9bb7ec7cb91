# compare.py's first look: every method once (seed 1), at the peak learning rates the six-method sweep chose
# (docs/study.md, 2026-12-03; the five later methods at their published or CoLA's rates), for 400 of the
# default's 1,000 steps: 15 minutes on 2 CPU cores with all eleven methods (measured 2026-12-03).
# python compare.py config/compare_quick.py
# tokens per run: 400 steps x 16 sequences x 256 tokens = 1.6M, 4.1 per full-rank non-embedding parameter
out_dir = 'out-compare-quick'
max_iters = 400
seeds = (1,)
learning_rates = (('full-rank', 4e-3), ('cola', 4e-3), ('dlr', 8e-3), ('elas', 4e-3), ('tsvd', 2e-3),
                  ('galore', 1e-2), ('fira', 1e-2),  # GaLore and Fira: their packages' lr, not yet swept here
                  ('low-rank', 4e-3), ('sltrain', 3e-3), ('relora', 1e-3))  # CoLA's lr; SLTrain's and ReLoRA's official lrs
