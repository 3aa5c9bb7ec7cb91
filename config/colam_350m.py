# 350M CoLA-M (CoLA trained with the CoLA-M checkpoint), the official CoLA recipe.
# torchrun --standalone --nproc_per_node=8 train.py config/colam_350m.py
# tokens per step: 8 GPUs x 32 sequences x 2 micro-steps x 256 tokens = 131,072 (512 sequences)
# training tokens: 60,000 steps x 131,072 = 7.86B
out_dir = 'out-colam-350m'
data_dir = 'data/c4'
wandb_run_name = 'colam-350m'

n_layer = 24
n_head = 16
n_embd = 1024
intermediate_size = 2736
block_size = 256
rank = 256
only_lr_act = True
checkpointing = 'cola_m'

batch_size = 32
gradient_accumulation_steps = 2
learning_rate = 0.003  # CoLA's peak; cosine to 0.1x
min_lr = 0.0003
max_iters = 60000
lr_decay_iters = 60000
warmup_iters = 6000
weight_decay = 0.01
grad_clip = 0.5
dtype = 'bfloat16'
parallel = 'ddp'
