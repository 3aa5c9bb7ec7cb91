# CoLA-60M, the official CoLA recipe: the deltas from train.py's defaults (CoLA-60M's recipe).
# torchrun --standalone --nproc_per_node=8 train.py config/cola_60m.py    (CoLA-M: add --checkpointing=cola_m)
# tokens per step: 8 GPUs x 64 sequences x 1 micro-step x 256 tokens = 131,072; 10,000 steps = 1.31B tokens
out_dir, wandb_run_name = 'out-cola-60m', 'cola-60m'
