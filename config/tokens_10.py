# CoLA's gap against training tokens per parameter (docs/study.md): full-rank and CoLA in the default study's shapes
# (d = 128, 2 layers) on Shakespeare's bytes, the default study's tokens: 1,000 steps of 4,096 tokens = 10.3
# per full-rank non-embedding parameter (395,904). This length is the default study's, whose full-length sweep (seed 1:
# 2e-3 to 1.6e-2, then sqrt(2) either side of the best; docs/study.md) chose full-rank 2.83e-3 and CoLA 8e-3: those
# rates are given here, and the two runs retrain that sweep's winners (one seed; CoLA's loss differs in the 4th digit
# since the merged down products sum x's gradient in another float32 order).
# python compare.py config/tokens_10.py   (then python compare.py config/tokens_trend.py for the table and plot)
out_dir = 'out-tokens-10'
max_iters = 1000
eval_interval = 100
learning_rates = (('full-rank', 2e-3 * 2 ** 0.5), ('cola', 8e-3))  # 2.83e-3 exactly as the sweep made it
seeds = (1,)
methods = ('full-rank', 'cola')
keep_checkpoints = False
