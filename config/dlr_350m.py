# DLR (CoLA with latent residuals, alpha 1) at CoLA-350M's recipe: the deltas from train.py's defaults.
# torchrun --standalone --nproc_per_node=8 train.py config/dlr_350m.py
# tokens per step: 8 GPUs x 32 sequences x 2 micro-steps x 256 tokens = 131,072; 60,000 steps = 7.86B tokens
out_dir, wandb_run_name = 'out-dlr-350m', 'dlr-350m'
n_layer, n_head, n_embd, intermediate_size = 24, 16, 1024, 2736
rank = 256
only_lr_act = True  # CoLA's own SiLU replaces SwiGLU's from 350m on
batch_size, gradient_accumulation_steps = 32, 2
learning_rate, min_lr = 0.003, 0.0003
max_iters = lr_decay_iters = 60_000
warmup_iters = 6_000
dlr_alpha = 1.0  # the paper's fixed alpha, on all seven projections
