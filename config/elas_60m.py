# ELAS at CoLA-60M's recipe (squared-ReLU MLP, 2:4 sparse after train.py's 1,000 dense steps): deltas from its defaults.
# torchrun --standalone --nproc_per_node=8 train.py config/elas_60m.py
# tokens per step: 8 GPUs x 64 sequences x 1 micro-step x 256 tokens = 131,072; 10,000 steps = 1.31B tokens
out_dir, wandb_run_name = 'out-elas-60m', 'elas-60m'
mlp = 'elas'
