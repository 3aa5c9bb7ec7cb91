# compare.py at the 60m shapes on C4, on one GPU (the CPU default is in compare.py itself):
# python prepare.py && python compare.py config/compare_60m.py
# tokens per step: 1 GPU x 64 sequences x 8 micro-steps x 256 tokens = 131,072 (512 sequences, as the recipe)
# 2,000 steps = 262M tokens per run, a fifth of the 10k-step recipe; 8 runs (2 full-rank lrs, 2 CoLA lrs,
# then CoLA-M, DLR, ELAS at the best CoLA lr and TSVD at the best full-rank lr)
out_dir, data_dir = 'out-compare-60m', 'data/c4'
n_layer, n_head, n_embd, intermediate_size, rank = 8, 8, 512, 1376, 128
batch_size, gradient_accumulation_steps = 64, 8
max_iters, warmup_iters, eval_interval, eval_tokens = 2000, 400, 200, 2_000_000
full_rank_lrs, cola_lrs = (1e-3, 3e-3), (3e-3, 6e-3)
device, dtype, compile_model = 'cuda', 'bfloat16', True
