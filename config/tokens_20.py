# CoLA's gap against training tokens per parameter (docs/study.md): full-rank and CoLA in the default study's shapes
# (d = 128, 2 layers) on Shakespeare's bytes, twice the default study's tokens: 2,000 steps of 4,096 tokens = 20.7
# per full-rank non-embedding parameter (395,904), each method at its own rate for this length (a longer run favours
# a smaller rate): a grid of three, full-rank's 1,000-step winner 2.83e-3 and half and twice it (CoLA's, 8e-3, is
# one sqrt(2) step above the grid), then sqrt(2) either side of each method's best; one seed. (At 2,000 steps a grid
# of two, 2.83e-3 and 5.66e-3, left full-rank's winner at its lower edge, 2e-3: hence 1.415e-3.)
# python compare.py config/tokens_20.py   (then python compare.py config/tokens_trend.py for the table and plot)
out_dir = 'out-tokens-20'
max_iters = 2000
eval_interval = 200
sweep_lrs = (1.415e-3, 2.83e-3, 5.66e-3)
seeds = (1,)
methods = ('full-rank', 'cola')
keep_checkpoints = False
