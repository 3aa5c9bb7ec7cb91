# ELAS at CoLA-130M's recipe (squared-ReLU MLP, 2:4 sparse after train.py's 1,000 dense steps): deltas from its defaults.
# torchrun --standalone --nproc_per_node=8 train.py config/elas_130m.py
# tokens per step: 8 GPUs x 64 sequences x 1 micro-step x 256 tokens = 131,072; 20,000 steps = 2.62B tokens
out_dir, wandb_run_name = 'out-elas-130m', 'elas-130m'
n_layer, n_head, n_embd, intermediate_size = 12, 12, 768, 2048
rank = 256
learning_rate, min_lr = 0.003, 0.0003
max_iters = lr_decay_iters = 20_000
warmup_iters = 2_000
mlp = 'elas'
