# 7B CoLA-M (CoLA trained with the CoLA-M checkpoint), the official CoLA recipe.
# torchrun --standalone --nproc_per_node=8 train.py config/colam_7b.py
# tokens per step: 8 GPUs x 8 sequences x 8 micro-steps x 256 tokens = 131,072 (512 sequences)
# training tokens: 150,000 steps x 131,072 = 19.66B
out_dir = 'out-colam-7b'
data_dir = 'data/c4'
wandb_run_name = 'colam-7b'

n_layer = 32
n_head = 32
n_embd = 4096
intermediate_size = 11008
block_size = 256
rank = 1024
only_lr_act = True
checkpointing = 'cola_m'

batch_size = 8
gradient_accumulation_steps = 8
learning_rate = 0.001  # CoLA's peak; cosine to 0.1x
min_lr = 0.0001
max_iters = 150000
lr_decay_iters = 150000
warmup_iters = 15000
weight_decay = 0.01
grad_clip = 0.5
dtype = 'bfloat16'
parallel = 'fsdp'  # DDP's full replica with AdamW states does not fit a 40-80 GB GPU
