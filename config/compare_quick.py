# compare.py's first look: every method once (seed 1), for 200 of the default's 1,000 steps, at the peak learning rate
# a sweep of 200-step runs chose (the default study's until 2026-12-05, docs/study.md: a rate suits its horizon, and
# these runs are 200 steps long), with half the evaluation and downstream items:
# 15 minutes 47 seconds on 2 CPU cores shared with a test run (measured 2026-12-04). Shows that every method runs
# and how its curve starts, not the study's gaps. python compare.py config/compare_quick.py
# tokens per run: 200 steps x 16 sequences x 256 tokens = 0.8M, 2.1 per full-rank non-embedding parameter
out_dir = 'out-compare-quick'
max_iters = 200
eval_interval = 25  # 9 points on each curve of the plot
eval_tokens = 32768
downstream_items = 100
seeds = (1,)
learning_rates = (('full-rank', 4e-3), ('cola', 8e-3), ('dlr', 4e-3), ('elas', 4e-3), ('tsvd', 4e-3),
                  ('galore', 1.6e-2), ('fira', 1.6e-2), ('low-rank', 4e-3), ('sltrain', 4e-3), ('relora', 2e-3))
