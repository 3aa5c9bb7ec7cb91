# 130M full-rank LLaMA, the official CoLA recipe.
# torchrun --standalone --nproc_per_node=8 train.py config/full_130m.py
# tokens per step: 8 GPUs x 64 sequences x 1 micro-step x 256 tokens = 131,072 (512 sequences)
# training tokens: 20,000 steps x 131,072 = 2.62B
out_dir = 'out-full-130m'
data_dir = 'data/c4'
wandb_run_name = 'full-130m'

n_layer = 12
n_head = 12
n_embd = 768
intermediate_size = 2048
block_size = 256
rank = 0
only_lr_act = False
checkpointing = 'none'

batch_size = 64
gradient_accumulation_steps = 1
learning_rate = 0.001  # the GaLore full-rank baseline's peak; cosine to 0.1x
min_lr = 0.0001
max_iters = 20000
lr_decay_iters = 20000
warmup_iters = 2000
weight_decay = 0.01
grad_clip = 0.5
dtype = 'bfloat16'
parallel = 'ddp'
