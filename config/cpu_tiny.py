# A tiny CoLA model that trains on 2 idle CPU cores in about a minute, on the bytes of the Shakespeare in assets/.
# Tokens per step: 1 process x 8 sequences x 1 micro-step x 256 tokens = 2,048; 300 steps = 614k tokens.
# First tokenise the text as bytes, then train:
#   python prepare.py --input_files=assets/tinyshakespeare.txt --encoding=byte --out_dir=data/tiny
#   python train.py config/cpu_tiny.py
out_dir, data_dir = 'out-cpu-tiny', 'data/tiny'
n_layer, n_head, n_embd, intermediate_size, rank = 4, 4, 256, 688, 64
batch_size = 8
learning_rate, min_lr = 3e-3, 3e-4
max_iters = lr_decay_iters = 300
warmup_iters = 30
eval_interval, eval_tokens, log_interval = 100, 32768, 10
device, dtype, compile_model = 'cpu', 'float32', False
tsvd_interval = 30  # with --projection=tsvd: new ranks every 10% of the steps
# With a method's flag, its own schedules at the share of the run that the official 10,000-step ones take:
galore_rank, galore_update_interval = 64, 6  # --optimizer=galore/fira: rank d/4 as the study's, T 200 of 10,000
relora_interval, relora_restart_warmup = 30, 3  # --projection=relora: 1,000 and 100 of 10,000
elas_warmup_iters = 30  # --mlp=elas: dense for the paper's 1,000 of 10,000 steps
