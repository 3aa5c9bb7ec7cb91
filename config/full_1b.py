# Full-rank LLaMA-1B, the official CoLA recipe: the deltas from train.py's defaults (CoLA-60M's recipe).
# torchrun --standalone --nproc_per_node=8 train.py config/full_1b.py
# the paper's data (docs/training.md, perplexity): python prepare.py --recipe=paper --train_shards=144 --val_tokens=10_000_000 --out_dir=data/c4-t5, then add --data_dir=data/c4-t5 --block_size=255 --vocab_size=32000
# tokens per step: 8 GPUs x 16 sequences x 4 micro-steps x 256 tokens = 131,072; 100,000 steps = 13.11B tokens
out_dir, wandb_run_name = 'out-full-1b', 'full-1b'
n_layer, n_head, n_embd, intermediate_size = 24, 32, 2048, 5461
rank = 0
batch_size, gradient_accumulation_steps = 16, 4
learning_rate, min_lr = 0.001, 0.0001  # the GaLore full-rank baseline's
max_iters = lr_decay_iters = 100_000
warmup_iters = 10_000
parallel = 'fsdp'  # DDP's full replica with AdamW states does not fit a 40-80 GB GPU
