# A tiny CoLA model that trains on 2 CPU cores in a few minutes, on bytes of any text:
# python prepare.py --input=path/to/text.txt --encoding=byte --out_dir=data/tiny
# python train.py config/cpu_tiny.py
# tokens per step: 1 process x 8 sequences x 1 micro-step x 256 tokens = 2,048
out_dir = 'out-cpu-tiny'
data_dir = 'data/tiny'
eval_interval = 100
eval_tokens = 32768
log_interval = 10

n_layer = 4
n_head = 4
n_embd = 256
intermediate_size = 688
block_size = 256
rank = 64
checkpointing = 'none'

batch_size = 8
learning_rate = 3e-3
min_lr = 3e-4
max_iters = 300
lr_decay_iters = 300
warmup_iters = 30
device = 'cpu'
dtype = 'float32'
compile = False
