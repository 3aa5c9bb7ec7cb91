# 60M CoLA, the official CoLA recipe.
# torchrun --standalone --nproc_per_node=8 train.py config/cola_60m.py
# tokens per step: 8 GPUs x 64 sequences x 1 micro-step x 256 tokens = 131,072 (512 sequences)
# training tokens: 10,000 steps x 131,072 = 1.31B
out_dir = 'out-cola-60m'
data_dir = 'data/c4'
wandb_run_name = 'cola-60m'

n_layer = 8
n_head = 8
n_embd = 512
intermediate_size = 1376
block_size = 256
rank = 128
only_lr_act = False
checkpointing = 'none'

batch_size = 64
gradient_accumulation_steps = 1
learning_rate = 0.006  # CoLA's peak; cosine to 0.1x
min_lr = 0.0006
max_iters = 10000
lr_decay_iters = 10000
warmup_iters = 2000
weight_decay = 0.01
grad_clip = 0.5
dtype = 'bfloat16'
parallel = 'ddp'
