# CoLA-60M, the official CoLA recipe: the deltas from train.py's defaults (CoLA-60M's recipe).
# torchrun --standalone --nproc_per_node=8 train.py config/cola_60m.py
# the paper's data (docs/training.md, perplexity): python prepare.py --recipe=paper --train_shards=15 --val_tokens=10_000_000 --out_dir=data/c4-t5, then add --data_dir=data/c4-t5 --block_size=255 --vocab_size=32000
# Methods on CoLA layers are flags (README, the methods): --checkpointing=cola-m (CoLA-M), --dlr_alpha=1.0 (DLR), --mlp=elas
# (ELAS), --projection=tsvd (TSVD), each with an out_dir of its own, e.g. --out_dir=out-dlr-60m
# tokens per step: 8 GPUs x 64 sequences x 1 micro-step x 256 tokens = 131,072; 10,000 steps = 1.31B tokens
out_dir, wandb_run_name = 'out-cola-60m', 'cola-60m'
