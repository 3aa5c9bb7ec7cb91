# 7B full-rank LLaMA, the official CoLA recipe.
# torchrun --standalone --nproc_per_node=8 train.py config/full_7b.py
# tokens per step: 8 GPUs x 4 sequences x 16 micro-steps x 256 tokens = 131,072 (512 sequences)
# (half CoLA's micro-batch: full-rank activations at 8 x 256 would not fit an 80 GB GPU; README)
# training tokens: 150,000 steps x 131,072 = 19.66B
out_dir = 'out-full-7b'
data_dir = 'data/c4'
wandb_run_name = 'full-7b'

n_layer = 32
n_head = 32
n_embd = 4096
intermediate_size = 11008
block_size = 256
rank = 0
only_lr_act = False
checkpointing = 'none'

batch_size = 4
gradient_accumulation_steps = 16
learning_rate = 0.001  # the GaLore full-rank baseline's peak; cosine to 0.1x
min_lr = 0.0001
max_iters = 150000
lr_decay_iters = 150000
warmup_iters = 15000
weight_decay = 0.01
grad_clip = 0.5
dtype = 'bfloat16'
parallel = 'fsdp'  # DDP's full replica with AdamW states does not fit a 40-80 GB GPU
