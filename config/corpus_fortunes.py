# The study on another corpus (docs/study.md, "Other corpora"): full-rank, CoLA and CoLA-M in the default study's regime
# (d = 128, 2 layers, 1,000 steps of 4,096 tokens: 10.3 tokens per full-rank non-embedding parameter) on 2.0 MB of
# Debian's fortune cookies (quotations, jokes, verse; assets/corpora.py makes the file), bytes, 3 seeds, each method at
# its own full-length rate: a grid of three (the study's four less 1.6e-2), then its best / and * sqrt(2).
# python assets/corpora.py fortunes <fortunes folder> data/fortunes.txt   (the package's steps: assets/corpora.py)
# python prepare.py --input_files=data/fortunes.txt --encoding=byte --out_dir=data/fortunes
# python compare.py config/corpus_fortunes.py
out_dir, data_dir = 'out-corpus-fortunes', 'data/fortunes'
methods = ('full-rank', 'cola', 'cola-m')
sweep_lrs = (2e-3, 4e-3, 8e-3)
keep_checkpoints = False
