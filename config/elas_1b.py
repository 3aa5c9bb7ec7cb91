# ELAS at CoLA-1B's recipe (squared-ReLU MLP, 2:4 sparse after train.py's 1,000 dense steps): deltas from its defaults.
# torchrun --standalone --nproc_per_node=8 train.py config/elas_1b.py
# tokens per step: 8 GPUs x 16 sequences x 4 micro-steps x 256 tokens = 131,072; 100,000 steps = 13.11B tokens
out_dir, wandb_run_name = 'out-elas-1b', 'elas-1b'
n_layer, n_head, n_embd, intermediate_size = 24, 32, 2048, 5461
rank = 512
batch_size, gradient_accumulation_steps = 16, 4
learning_rate, min_lr = 0.002, 0.0002
max_iters = lr_decay_iters = 100_000
warmup_iters = 10_000
parallel = 'fsdp'  # DDP's full replica with AdamW states does not fit a 40-80 GB GPU
mlp = 'elas'
