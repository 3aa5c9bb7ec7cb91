# Full-rank LLaMA-7B, the official CoLA recipe: the deltas from train.py's defaults (CoLA-60M's recipe).
# torchrun --standalone --nproc_per_node=8 train.py config/full_7b.py
# the paper's data (docs/training.md, perplexity): python prepare.py --recipe=paper --train_shards=216 --val_tokens=10_000_000 --out_dir=data/c4-t5, then add --data_dir=data/c4-t5 --block_size=255 --vocab_size=32000
# tokens per step: 8 GPUs x 4 sequences x 16 micro-steps x 256 tokens = 131,072; 150,000 steps = 19.66B tokens
out_dir, wandb_run_name = 'out-full-7b', 'full-7b'
n_layer, n_head, n_embd, intermediate_size = 32, 32, 4096, 11008
rank = 0
batch_size, gradient_accumulation_steps = 4, 16  # full-rank activations at 8 x 256 would not fit an 80 GB GPU
learning_rate, min_lr = 0.001, 0.0001  # the GaLore full-rank baseline's
max_iters = lr_decay_iters = 150_000
warmup_iters = 15_000
parallel = 'fsdp'  # DDP's full replica with AdamW states does not fit a 40-80 GB GPU
