# Full-rank LLaMA-130M, the official CoLA recipe: the deltas from train.py's defaults (CoLA-60M's recipe).
# torchrun --standalone --nproc_per_node=8 train.py config/full_130m.py
# the paper's data (docs/training.md, perplexity): python prepare.py --recipe=paper --train_shards=29 --val_tokens=10_000_000 --out_dir=data/c4-t5, then add --data_dir=data/c4-t5 --block_size=255 --vocab_size=32000
# tokens per step: 8 GPUs x 64 sequences x 1 micro-step x 256 tokens = 131,072; 20,000 steps = 2.62B tokens
out_dir, wandb_run_name = 'out-full-130m', 'full-130m'
n_layer, n_head, n_embd, intermediate_size = 12, 12, 768, 2048
rank = 0
learning_rate, min_lr = 0.001, 0.0001  # the GaLore full-rank baseline's
max_iters = lr_decay_iters = 20_000
warmup_iters = 2_000
