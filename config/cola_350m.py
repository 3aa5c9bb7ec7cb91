# CoLA-350M, the official CoLA recipe: the deltas from train.py's defaults (CoLA-60M's recipe).
# torchrun --standalone --nproc_per_node=8 train.py config/cola_350m.py
# the paper's data (docs/training.md, perplexity): python prepare.py --recipe=paper --train_shards=87 --val_tokens=10_000_000 --out_dir=data/c4-t5, then add --data_dir=data/c4-t5 --block_size=255 --vocab_size=32000
# Methods on CoLA layers are flags (README, the methods): --checkpointing=cola-m (CoLA-M), --dlr_alpha=1.0 (DLR), --mlp=elas
# (ELAS), --projection=tsvd (TSVD), each with an out_dir of its own, e.g. --out_dir=out-dlr-350m
# tokens per step: 8 GPUs x 32 sequences x 2 micro-steps x 256 tokens = 131,072; 60,000 steps = 7.86B tokens
out_dir, wandb_run_name = 'out-cola-350m', 'cola-350m'
n_layer, n_head, n_embd, intermediate_size = 24, 16, 1024, 2736
rank = 256
only_lr_act = True  # CoLA's own SiLU replaces SwiGLU's from 350m on
batch_size, gradient_accumulation_steps = 32, 2
learning_rate, min_lr = 0.003, 0.0003
max_iters = lr_decay_iters = 60_000
warmup_iters = 6_000
