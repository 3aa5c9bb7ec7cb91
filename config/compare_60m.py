# compare.py at the 60m shapes on C4, on one GPU (the CPU default is in compare.py itself):
# python prepare.py && python compare.py config/compare_60m.py
# tokens per step: 1 GPU x 64 sequences x 8 micro-steps x 256 tokens = 131,072 (512 sequences, as the recipe)
# 2,000 steps = 262M tokens per run: 10.4 per full-rank non-embedding parameter (25.3M), a fifth of the recipe;
# 7 methods x 4 lrs swept for 500 steps, then 8 methods x 3 seeds: 52 runs, 62,000 steps. Not yet run.
out_dir, data_dir = 'out-compare-60m', 'data/c4'
n_layer, n_head, n_embd, intermediate_size, rank = 8, 8, 512, 1376, 128
batch_size, gradient_accumulation_steps = 64, 8
max_iters, eval_interval, eval_tokens = 2000, 200, 2_000_000
sweep_lrs = (1e-3, 3e-3, 6e-3, 1e-2)  # 1e-2: GaLore's and Fira's official lr
device, dtype, compile_model = 'cuda', 'bfloat16', True
