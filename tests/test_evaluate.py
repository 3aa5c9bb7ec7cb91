import json
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import TINY, TINY_TRAIN
from helpers import refused, run

import evaluate
from model import Transformer
from shards import ByteEncoding


@pytest.fixture(scope='module')
def trained(data):
    run(data, 'train.py', *TINY_TRAIN, '--data_dir=data', '--out_dir=ev', '--max_iters=3')
    return data


def test_a_continuations_log_likelihood_is_the_sum_over_its_tokens():
    torch.manual_seed(0)
    model = Transformer(TINY).eval()
    context, continuation = [5, 9, 2, 7], [3, 3, 8]
    logits, _ = model(torch.tensor([context + continuation]))
    logp = F.log_softmax(logits[0].double(), dim=-1)
    expected = sum(logp[len(context) - 1 + i, t].item() for i, t in enumerate(continuation))  # token i given all before
    assert evaluate.continuation_logprob(model, context, continuation) == pytest.approx(expected, rel=1e-5)


def test_accuracy_takes_the_largest_sum_and_normalised_accuracy_divides_by_the_choices_characters():
    """lm-evaluation-harness's rule: the continuation is ' ' + choice, acc_norm divides by len(choice) in characters
    (the delimiter not counted; 'né' is 2 characters and 3 bytes)."""
    torch.manual_seed(0)
    model, enc = Transformer(replace(TINY, vocab_size=320)).eval(), ByteEncoding()
    examples = [('the cat', ['a', 'sat on the mat', 'ran'], 1), ('a dog', ['barked loudly', 'b', 'né'], 0)]
    scores = {c: evaluate.continuation_logprob(model, list(ctx.encode()), list((' ' + c).encode()))
              for ctx, choices, _ in examples for c in choices}
    acc = np.mean([np.argmax([scores[c] for c in ch]) == g for _, ch, g in examples])
    acc_norm = np.mean([np.argmax([scores[c] / len(c) for c in ch]) == g for _, ch, g in examples])
    result = evaluate.multiple_choice(model, enc, examples)
    assert (result['acc'], result['acc_norm'], result['items']) == (acc, acc_norm, 2)


def test_hellaswag_text_is_cleaned_in_lm_evaluation_harness_order(tmp_path):
    # lm-eval's preprocess: strip, ' [title]' -> '. ', [tags] removed, '  ' -> ' ', nothing stripped after: the tag
    # at the start leaves a leading space (computed by hand from that rule)
    item = {'activity_label': 'Home', 'ctx_a': '[header] How to clean a pan [title] Soak it.', 'ctx_b': '[step] scrub.',
            'endings': ['[substeps] Rinse it [title] well.', 'Dry it.'], 'label': 0}
    (tmp_path / 'hs.jsonl').write_text(json.dumps(item) + '\n')
    [(context, choices, gold)] = evaluate.hellaswag_examples(str(tmp_path / 'hs.jsonl'))
    assert context == 'Home: How to clean a pan. Soak it. scrub.'
    assert choices == [' Rinse it. well.', 'Dry it.'] and gold == 0


def test_greedy_exact_match_is_what_generate_would_produce():
    torch.manual_seed(0)
    model = Transformer(TINY).eval()
    context = [1, 2, 3, 4]
    greedy = model.generate(torch.tensor([context]), 3, temperature=0)[0, 4:].tolist()
    assert evaluate.greedy_matches(model, context, greedy)
    assert not evaluate.greedy_matches(model, context, greedy[:2] + [(greedy[2] + 1) % 96])


def test_built_in_items_are_deterministic_and_keep_the_true_continuation_apart():
    tokens = np.arange(5000)
    a = evaluate.next_passage_items(tokens, np.random.default_rng(0))
    b = evaluate.next_passage_items(tokens, np.random.default_rng(0))
    assert a == b and len(a) == evaluate.items
    for context, choices, gold in a:
        assert choices[gold] == list(range(context[-1] + 1, context[-1] + 1 + evaluate.choice_tokens))  # the true next span
        assert all(abs(c[0] - choices[gold][0]) >= evaluate.context_tokens + evaluate.choice_tokens
                   for i, c in enumerate(choices) if i != gold)
    assert 0.15 < np.mean([g == 0 for _, _, g in a]) < 0.35  # the answer's position is random


def write_published_formats(folder):
    (folder / 'hellaswag.jsonl').write_text(json.dumps({'activity_label': 'Cooking', 'ctx_a': 'the cat', 'ctx_b': 'sees',
                                                         'endings': ['the sea.', 'a bird.', 'bread.', 'the king.'],
                                                         'label': 1}) + '\n')
    arc = {'id': 'x', 'question': {'stem': 'What does the cat see?', 'choices': [
        {'text': 'the sea', 'label': 'A'}, {'text': 'a bird', 'label': 'B'}, {'text': 'nothing', 'label': 'C'}]},
        'answerKey': 'B'}
    (folder / 'arc.jsonl').write_text(json.dumps(arc) + '\n' + json.dumps({**arc, 'answerKey': 'A'}) + '\n')
    (folder / 'piqa.jsonl').write_text(json.dumps({'goal': 'find bread', 'sol1': 'look', 'sol2': 'sleep'}) + '\n')
    (folder / 'piqa-labels.lst').write_text('0\n')
    (folder / 'lambada.jsonl').write_text(json.dumps({'text': 'my friend likes the sea and the king finds bread'}) + '\n')


def test_evaluate_py_scores_the_built_in_tasks_and_the_four_published_formats(trained):
    write_published_formats(trained)
    r = run(trained, 'evaluate.py', '--out_dir=ev', '--items=20', '--context_tokens=16', '--choice_tokens=8',
            '--hellaswag=hellaswag.jsonl', '--arc_easy=arc.jsonl', '--arc_challenge=arc.jsonl', '--piqa=piqa.jsonl',
            '--piqa_labels=piqa-labels.lst', '--lambada=lambada.jsonl')
    report = json.loads((trained / 'ev' / 'evaluate.json').read_text())
    scores = report['scores']
    assert set(scores) == {'next_passage', 'last_word', 'hellaswag', 'arc_easy', 'arc_challenge', 'piqa', 'lambada'}
    assert scores['next_passage']['items'] == 20 and scores['arc_easy']['items'] == 2 and scores['lambada']['items'] == 1
    assert all(0 <= s['acc'] <= 1 for s in scores.values()) and '| hellaswag | 1 |' in r.stdout
    # each task's chance level beside its score (write_published_formats: ARC 3 choices, PIQA 2, HellaSwag 4)
    assert scores['next_passage']['chance'] == scores['hellaswag']['chance'] == 0.25
    assert scores['arc_easy']['chance'] == pytest.approx(1 / 3)
    assert scores['piqa']['chance'] == 0.5 and scores['lambada']['chance'] == 0
    assert r.stderr.startswith('scoring ev/ckpt.pt: the state after iter 3 of 3')  # which checkpoint was read
    again = run(trained, 'evaluate.py', '--out_dir=ev', '--items=20', '--context_tokens=16', '--choice_tokens=8', '--as_json')
    assert json.loads(again.stdout)['scores']['next_passage'] == scores['next_passage']  # the same items, the same score


@pytest.mark.parametrize('args,message', [
    (['--arc_easy=missing.jsonl'], 'missing.jsonl does not exist'),
    (['--arc_easy=bad_arc.jsonl'], "bad_arc.jsonl:1: answerKey 'E' is not one of the choices' labels"),
    (['--piqa=piqa.jsonl'], "piqa.jsonl: expected a label 0 or 1 for each of its 1 lines"),
    (['--hellaswag=lambada.jsonl'], "lambada.jsonl:1: no field 'activity_label'"),
    (['--items=0'], 'items=0: expected a positive number'),
    (['--hellaswag=string_endings.jsonl'], "string_endings.jsonl:1: 'endings' is str 'the sea.': expected a list of 2"),
    (['--hellaswag=far_label.jsonl'], "far_label.jsonl:1: 'label' is 7: expected the index of one of its 4 endings"),
    (['--hellaswag=letter_label.jsonl'], "letter_label.jsonl:1: 'label' is 'B': expected the index of one of its 4"),
    (['--hellaswag=no_endings.jsonl'], "no_endings.jsonl:1: 'endings' is list '[]': expected a list of 2"),
    (['--hellaswag=empty.jsonl'], 'empty.jsonl holds no items: expected one JSON object per line'),
    (['--piqa=array.jsonl'], 'array.jsonl:1: a JSON list, expected an object'),
    (['--arc_easy=unlabelled_arc.jsonl'], "unlabelled_arc.jsonl:1: no field 'label'"),
    (['--piqa=piqa.jsonl', '--piqa_labels=bad.lst'], "piqa_labels='bad.lst': line 'x': expected a 0 or 1 on each line"),
    (['--piqa=piqa.jsonl', '--piqa_labels=nope.lst'], "piqa_labels='nope.lst': cannot be read as text (No such file"),
    (['--piqa=piqa.jsonl', '--piqa_labels=binary.lst'], "piqa_labels='binary.lst': cannot be read as text (not UTF-8)"),
    (['--lambada=one_word.jsonl'], "one_word.jsonl:1: 'text' 'word ' has no context and last word to predict"),
    (['--lambada=number.jsonl'], "number.jsonl:1: 'text' is int 42: expected text"),
    (['--seed=-1'], 'seed=-1: expected 0 or more'),
    (['--piqa=labelled.jsonl', '--piqa_labels=piqa-labels.lst'], "labelled.jsonl:1: its label 1 differs from line 1"),
    (['--device=cuda:7' if torch.cuda.device_count() < 8 else '--device=cuda:99'], "expected 'cpu', or 'cuda' on a machine"),
])
def test_bad_task_files_and_settings_are_one_line_errors(trained, args, message):
    write_published_formats(trained)
    item = json.loads((trained / 'hellaswag.jsonl').read_text())
    (trained / 'string_endings.jsonl').write_text(json.dumps({**item, 'endings': 'the sea.'}) + '\n')
    (trained / 'far_label.jsonl').write_text(json.dumps({**item, 'label': 7}) + '\n')
    (trained / 'letter_label.jsonl').write_text(json.dumps({**item, 'label': 'B'}) + '\n')
    (trained / 'no_endings.jsonl').write_text(json.dumps({**item, 'endings': []}) + '\n')
    (trained / 'empty.jsonl').write_text('\n\n')
    (trained / 'array.jsonl').write_text('[1, 2, 3]\n')
    (trained / 'unlabelled_arc.jsonl').write_text(json.dumps({'question': {'stem': 'q', 'choices': [
        {'text': 'a', 'label': 'A'}, {'text': 'b'}]}, 'answerKey': 'A'}) + '\n')
    (trained / 'bad.lst').write_text('0\nx\n')
    (trained / 'binary.lst').write_bytes(b'\xff\n')
    (trained / 'one_word.jsonl').write_text(json.dumps({'text': 'word '}) + '\n')
    (trained / 'number.jsonl').write_text(json.dumps({'text': 42}) + '\n')
    (trained / 'labelled.jsonl').write_text(json.dumps({'goal': 'g', 'sol1': 'a', 'sol2': 'b', 'label': 1}) + '\n')
    (trained / 'bad_arc.jsonl').write_text(json.dumps({'question': {'stem': 'q', 'choices': [
        {'text': 'a', 'label': 'A'}, {'text': 'b', 'label': 'B'}]}, 'answerKey': 'E'}) + '\n')
    refused(run(trained, 'evaluate.py', '--out_dir=ev', '--items=5', '--context_tokens=16', '--choice_tokens=8', *args,
                check=False), message)


def test_evaluate_py_scores_a_paper_recipe_run_with_its_own_tokenizer(paper_data):
    run(paper_data, 'train.py', '--data_dir=data', '--out_dir=ev-paper', '--n_layer=1', '--n_head=2', '--n_embd=32',
        '--intermediate_size=64', '--rank=8', '--block_size=31', '--batch_size=4', '--max_iters=2', '--eval_tokens=200',
        '--device=cpu', '--compile_model=False')
    r = run(paper_data, 'evaluate.py', '--out_dir=ev-paper', '--items=10', '--context_tokens=16', '--choice_tokens=8',
            '--as_json')
    scores = json.loads(r.stdout)['scores']
    assert scores['next_passage']['items'] == 10 and 0 <= scores['last_word']['acc'] <= 1
