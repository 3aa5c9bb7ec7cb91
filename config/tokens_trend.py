# CoLA's gap to full-rank against training tokens per full-rank non-embedding parameter, 10.3 / 20.7 / 41.4 (the
# paper's 60M runs: 52), from the three studies on Shakespeare's bytes once they have run:
# python compare.py config/tokens_10.py && python compare.py config/tokens_20.py && python compare.py config/tokens_40.py
# python compare.py config/tokens_trend.py   # writes out-tokens-trend/trend.md and trend.png
out_dir = 'out-tokens-trend'
trend = ('out-tokens-10', 'out-tokens-20', 'out-tokens-40')
