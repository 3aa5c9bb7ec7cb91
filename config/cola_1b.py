# CoLA-1B, the official CoLA recipe: the deltas from train.py's defaults (CoLA-60M's recipe).
# torchrun --standalone --nproc_per_node=8 train.py config/cola_1b.py
# the paper's data (docs/training.md, perplexity): python prepare.py --recipe=paper --train_shards=144 --val_tokens=10_000_000 --out_dir=data/c4-t5, then add --data_dir=data/c4-t5 --block_size=255 --vocab_size=32000
# Methods on CoLA layers are flags (README, the methods): --checkpointing=cola-m (CoLA-M), --dlr_alpha=1.0 (DLR), --mlp=elas
# (ELAS), --projection=tsvd (TSVD), each with an out_dir of its own, e.g. --out_dir=out-dlr-1b
# tokens per step: 8 GPUs x 16 sequences x 4 micro-steps x 256 tokens = 131,072; 100,000 steps = 13.11B tokens
out_dir, wandb_run_name = 'out-cola-1b', 'cola-1b'
n_layer, n_head, n_embd, intermediate_size = 24, 32, 2048, 5461
rank = 512
only_lr_act = True  # CoLA's own SiLU replaces SwiGLU's from 350m on
batch_size, gradient_accumulation_steps = 16, 4
learning_rate, min_lr = 0.002, 0.0002
max_iters = lr_decay_iters = 100_000
warmup_iters = 10_000
parallel = 'fsdp'  # DDP's full replica with AdamW states does not fit a 40-80 GB GPU
