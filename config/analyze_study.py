# analyze.py on compare.py's CPU study (python compare.py first): the seed-1 run of every method, with its trajectory
# of 10 checkpoints, against full-rank's seed-1 run. python analyze.py config/analyze_study.py
# Each loss along a path is the exact mean over the first 8,192 validation tokens; 5 random directions and the top-5
# singular ones on 7 points each, 11 points between consecutive checkpoints: about 180 losses per run.
runs = ('out-compare/full-rank-seed1,out-compare/cola-seed1,out-compare/cola-m-seed1,out-compare/dlr-seed1,'
        'out-compare/elas-seed1,out-compare/tsvd-seed1,out-compare/galore-seed1,out-compare/fira-seed1,'
        'out-compare/low-rank-seed1,out-compare/sltrain-seed1,out-compare/relora-seed1')
reference = 'out-compare/full-rank-seed1'
out_dir = 'out-compare/analysis'
eval_tokens = 8192
top_k = 5
alphas = 11
