# compare.py's eleven methods at the 60m shapes on C4, on one GPU (the CPU default is in compare.py itself):
# python prepare.py && python compare.py config/compare_60m.py
# tokens per step: 1 GPU x 64 sequences x 8 micro-steps x 256 tokens = 131,072 (512 sequences, as the recipe)
# 2,000 steps = 262M tokens per run: 10.4 per full-rank non-embedding parameter (25.3M), a fifth of the recipe's 10,000;
# every method's schedules scale with it (compare.py: GaLore's T = 2%, ReLoRA's merges every 10%, ...).
# 5 methods x (4 lrs, then 2 around the best) swept at full length, the winners being their seed-1 runs, then the
# other 11 x 3 - 5 study runs: 58 runs, 116,000 steps. Not yet run on a GPU.
out_dir, data_dir = 'out-compare-60m', 'data/c4'
n_layer, n_head, n_embd, intermediate_size, rank = 8, 8, 512, 1376, 128  # rank 128: every official 60m script's
batch_size, gradient_accumulation_steps = 64, 8
max_iters, eval_interval, eval_tokens = 2000, 200, 2_000_000
sweep_lrs = (1e-3, 3e-3, 6e-3, 1e-2)  # for the methods without an official 60m lr: full-rank, DLR, ELAS, TSVD, Low-Rank
learning_rates = (('cola', 6e-3),  # CoLA's 60m recipe (CoLA-M takes CoLA's)
                  ('galore', 1e-2), ('fira', 1e-2),  # the official 60m scripts' lr (with scale / alpha 0.25: compare.py's)
                  ('sltrain', 3e-3),  # SLTrain's 60m script (rank 128, alpha 32, delta 0.03: model.py's defaults)
                  ('relora', 1e-3))  # Beyond Perplexity's 60m ReLoRA (merge every 1,000 of 10,000, re-warm 100, 99% pruned)
device, dtype, compile_model = 'cuda', 'bfloat16', True
