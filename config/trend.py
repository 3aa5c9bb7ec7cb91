# The size trend: CoLA's gap to full-rank at d = 64, 128 and 256 (r = d/4, 2 layers, 10.3 tokens per full-rank
# non-embedding parameter, each at its own full-horizon learning rate), from the three studies once they have run:
# python compare.py config/trend_d64.py && python compare.py && python compare.py config/trend_d256.py
# python compare.py config/trend.py   # writes out-trend/trend.md and trend.png
out_dir = 'out-trend'
trend = ('out-trend-d64', 'out-compare', 'out-trend-d256')
