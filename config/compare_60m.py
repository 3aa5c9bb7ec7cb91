# compare.py at the 60m shapes on C4, on one GPU (the CPU default is in compare.py itself):
# python prepare.py && python compare.py config/compare_60m.py
# tokens per step: 1 GPU x 64 sequences x 8 micro-steps x 256 tokens = 131,072 (512 sequences, as the recipe)
# 2,000 steps = 262M tokens per run, a fifth of the 10k-step recipe; 5 runs (2 full-rank lrs, 2 CoLA lrs, CoLA-M)
out_dir = 'out-compare-60m'
data_dir = 'data/c4'
n_layer = 8
n_head = 8
n_embd = 512
intermediate_size = 1376
rank = 128
block_size = 256
batch_size = 64
gradient_accumulation_steps = 8
max_iters = 2000
warmup_iters = 400
eval_interval = 200
eval_tokens = 2_000_000
full_rank_lrs = (1e-3, 3e-3)
cola_lrs = (3e-3, 6e-3)
device = 'cuda'
dtype = 'bfloat16'
compile = True
