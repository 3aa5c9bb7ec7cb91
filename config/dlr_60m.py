# DLR (CoLA with latent residuals, alpha 1) at CoLA-60M's recipe: the deltas from train.py's defaults.
# torchrun --standalone --nproc_per_node=8 train.py config/dlr_60m.py
# tokens per step: 8 GPUs x 64 sequences x 1 micro-step x 256 tokens = 131,072; 10,000 steps = 1.31B tokens
out_dir, wandb_run_name = 'out-dlr-60m', 'dlr-60m'
dlr_alpha = 1.0  # the paper's fixed alpha, on all seven projections
