# DLR (CoLA with latent residuals, alpha 1) at CoLA-130M's recipe: the deltas from train.py's defaults.
# torchrun --standalone --nproc_per_node=8 train.py config/dlr_130m.py
# tokens per step: 8 GPUs x 64 sequences x 1 micro-step x 256 tokens = 131,072; 20,000 steps = 2.62B tokens
out_dir, wandb_run_name = 'out-dlr-130m', 'dlr-130m'
n_layer, n_head, n_embd, intermediate_size = 12, 12, 768, 2048
rank = 256
learning_rate, min_lr = 0.003, 0.0003
max_iters = lr_decay_iters = 20_000
warmup_iters = 2_000
dlr_alpha = 1.0  # the paper's fixed alpha, on all seven projections
