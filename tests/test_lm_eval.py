"""lm-evaluation-harness through our `nanocola` model class against lm-eval's own `hf` model on the run's Hugging Face
export: the same answer to every request, item by item, and the same metrics."""
import functools
import json

import numpy as np
import pytest
from conftest import TINY_TRAIN
from helpers import published_task_files, run

import evaluate

PUBLISHED = ['hellaswag_local', 'arc_easy_local', 'arc_challenge_local', 'piqa_local', 'lambada_openai_local']


@pytest.fixture(scope='module')
def exported(data):
    """A full-rank and a CoLA run of 3 steps, each exported, beside the published task files (data/tasks/)."""
    run(data, 'train.py', *TINY_TRAIN, '--rank=0', '--data_dir=data', '--out_dir=lm-full', '--max_iters=3')
    run(data, 'train.py', *TINY_TRAIN, '--data_dir=data', '--out_dir=lm-cola', '--max_iters=3')
    for name in ('lm-full', 'lm-cola'):
        run(data, 'export.py', f'--out_dir={name}', f'--export_dir={name}-hf')
    published_task_files(data)
    return data


@functools.cache
def task_manager():
    """lm-eval's index of its own task files and ours: seconds to build, so once for the module's four scorings."""
    from lm_eval.tasks import TaskManager
    return TaskManager(include_path=evaluate.TASKS_DIR)


def scored(model, model_args=None):
    """lm-eval's results and per-item answers for the five published tasks (local files) and three request types
    they lack: a text's rolling log-likelihood over several windows, and greedy generation up to a stop string."""
    from lm_eval import simple_evaluate
    texts = ['ROMEO:\nBut soft, what light through yonder window breaks?\n\nJULIET:\nAy me.', 'KING:\nSo be it.']
    with open('texts.jsonl', 'w') as f:
        f.writelines(json.dumps({'text': t}) + '\n' for t in texts)
    data = {'dataset_path': 'json', 'dataset_kwargs': {'data_files': {'test': 'texts.jsonl'}}, 'test_split': 'test'}
    more = [data | {'task': 'rolling', 'output_type': 'loglikelihood_rolling', 'doc_to_text': '', 'doc_to_target': 'text',
                    'metric_list': [{'metric': 'word_perplexity'}]},
            data | {'task': 'generation', 'output_type': 'generate_until', 'doc_to_text': 'text', 'doc_to_target': 'text',
                    'generation_kwargs': {'until': ['\n\n', 'e'], 'max_gen_toks': 8, 'do_sample': False},
                    'metric_list': [{'metric': 'exact_match'}]}]
    tasks = task_manager().load(PUBLISHED + more)['tasks']
    results = simple_evaluate(model=model, model_args=model_args, tasks=list(tasks.values()), bootstrap_iters=0,
                              batch_size=3, log_samples=True)
    return results['results'], {task: [s['resps'] for s in samples] for task, samples in results['samples'].items()}


@pytest.mark.parametrize('run_dir', ['lm-full', 'lm-cola'])
def test_lm_eval_scores_through_nanocola_equal_its_hf_model_on_the_runs_export(exported, monkeypatch, run_dir):
    """Every request type (loglikelihood, rolling, generation), item by item, to float32 rounding; every metric the
    same. The export's tokenizer is the byte encoding's; CoLA's export loads with our modeling code."""
    monkeypatch.chdir(exported)  # the *_local task files read data/tasks/ where lm-eval runs
    ours, our_answers = scored(evaluate.NanoCoLA(run_dir, batch_size=3))
    theirs, their_answers = scored('hf', {'pretrained': f'{run_dir}-hf', 'dtype': 'float32', 'device': 'cpu',
                                          'trust_remote_code': run_dir == 'lm-cola'})
    assert set(our_answers) == {'hellaswag', 'arc_easy', 'arc_challenge', 'piqa', 'lambada_openai', 'rolling', 'generation'}
    assert [len(our_answers[t]) for t in ('hellaswag', 'arc_easy', 'arc_challenge', 'piqa')] == [4, 4, 2, 2]  # as made
    for task, answers in our_answers.items():
        for ours_item, theirs_item in zip(answers, their_answers[task], strict=True):
            if task == 'generation':
                assert ours_item == theirs_item
            else:
                got = [a[0][0] if isinstance(a[0], tuple) else a[0] for a in ours_item]
                expected = [a[0][0] if isinstance(a[0], tuple) else a[0] for a in theirs_item]
                np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)
                assert [a[0][1] for a in ours_item if isinstance(a[0], tuple)] == \
                    [a[0][1] for a in theirs_item if isinstance(a[0], tuple)]  # is_greedy
    for task in our_answers:
        for metric, value in ours[task].items():
            if isinstance(value, float) and not metric.endswith('perplexity,none'):
                assert value == theirs[task][metric], (task, metric)
            elif isinstance(value, float):
                assert value == pytest.approx(theirs[task][metric], rel=1e-4)
    assert any(answer != [['']] for answer in our_answers['generation'])  # it generated something


def requests(kind, *arguments):
    from lm_eval.api.instance import Instance
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(arguments)]


def test_at_the_limits_nanocola_answers_as_the_hf_model_or_better_and_refuses_the_impossible_in_one_line(exported, capsys,
                                                                                                      monkeypatch):
    """Block size 32. lm-eval's hf model on the export is the reference where it answers; where it stops with an
    assertion (no room to generate, a context of only spaces, a continuation no window holds), nanocola refuses in
    one line or, for the spaces, scores as lm-eval scores an empty context."""
    from lm_eval.models.huggingface import HFLM
    monkeypatch.chdir(exported)
    ours = evaluate.NanoCoLA('lm-full', batch_size=2)
    theirs = HFLM(pretrained=str(exported / 'lm-full-hf'), dtype='float32', device='cpu', batch_size=2)
    long_context = 'the cat sees the sea. ' * 8  # 176 bytes: cut on the left by both
    fits = requests('generate_until', (long_context, {'until': ['\n\n'], 'max_gen_toks': 31, 'do_sample': False}))
    assert ours.generate_until(fits) == theirs.generate_until(fits)
    no_room = requests('generate_until', ('the cat', {'until': ['\n\n'], 'max_gen_toks': 32, 'do_sample': False}))
    with pytest.raises(AssertionError, match='must be less than'):
        theirs.generate_until(no_room)
    with pytest.raises(SystemExit, match=r'^generate_until: max_gen_toks=32 leaves no room .* block_size=32: expected 1 to 31'):
        ours.generate_until(no_room)
    empty = requests('loglikelihood', ('', ' the sea'), ('', 'the cat sees'))
    np.testing.assert_allclose(ours.loglikelihood(empty), theirs.loglikelihood(empty), rtol=1e-5)
    spaces = requests('loglikelihood', ('   ', 'the sea'))
    with pytest.raises(AssertionError):
        theirs.loglikelihood(spaces)
    assert ours.loglikelihood(spaces) == pytest.approx(theirs.loglikelihood(requests('loglikelihood', ('', '   the sea'))))
    too_long = requests('loglikelihood', ('the', ' cat' * 9))  # 36 continuation tokens
    with pytest.raises(AssertionError):
        theirs.loglikelihood(too_long)
    with pytest.raises(SystemExit, match='a continuation of 36 tokens .* expected at most block_size=32'):
        ours.loglikelihood(too_long)
    capsys.readouterr()
    assert len(ours.generate_until(requests('generate_until', ('', {'until': ['.'], 'max_gen_toks': 4})))) == 1
    assert 'an empty context: generating after the end-of-text token' in capsys.readouterr().err
