# The study on another corpus (docs/study.md, "Other corpora"): full-rank, CoLA and CoLA-M in the default study's regime
# (d = 128, 2 layers, 1,000 steps of 4,096 tokens: 10.3 tokens per full-rank non-embedding parameter) on 2.0 MB of
# Python source (CPython 3.11's Lib/*.py; assets/corpora.py makes the file), bytes, 3 seeds, each method at
# its own full-length rate: a grid of three (the study's four less 1.6e-2), then its best / and * sqrt(2).
# python assets/corpora.py code <the stdlib folder> data/code.txt   (the folder: assets/corpora.py)
# python prepare.py --input_files=data/code.txt --encoding=byte --out_dir=data/code
# python compare.py config/corpus_code.py
out_dir, data_dir = 'out-corpus-code', 'data/code'
methods = ('full-rank', 'cola', 'cola-m')
sweep_lrs = (2e-3, 4e-3, 8e-3)
keep_checkpoints = False
