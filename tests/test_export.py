"""export.py: runs whose projections are one matrix each load in plain transformers and compute the same logits."""
import json

import pytest
import torch
from conftest import TINY_TRAIN, needs_gpt2
from helpers import refused, run, train_log

from model import load_checkpoint, model_from_checkpoint


@pytest.mark.parametrize('method', [[], ['--projection=relora', '--relora_interval=2'], ['--projection=tsvd'],
                                    ['--projection=sltrain']], ids=['full-rank', 'relora', 'tsvd', 'sltrain'])
def test_an_export_loads_in_plain_transformers_with_the_runs_logits(data, method):
    from transformers import AutoModelForCausalLM
    name = (method[0].split('=')[1] if method else 'full') + '-run'
    rank = [] if method else ['--rank=0']
    run(data, 'train.py', *TINY_TRAIN, *rank, *method, '--data_dir=data', f'--out_dir={name}', '--max_iters=3',
        '--eval_interval=3')
    run(data, 'export.py', f'--out_dir={name}', f'--export_dir={name}-hf')
    ours = model_from_checkpoint(load_checkpoint(data / name / 'ckpt.pt')).eval()
    theirs = AutoModelForCausalLM.from_pretrained(str(data / f'{name}-hf')).eval()  # no trust_remote_code
    assert type(theirs).__name__ == 'LlamaForCausalLM'
    idx = torch.randint(0, ours.config.vocab_size, (2, ours.config.block_size))
    with torch.no_grad():
        expected, _ = ours(idx, idx)  # (targets: every position's logits)
        got = theirs(idx).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=2e-5)  # float32 rounding (TSVD's W formed in float64)


def test_a_dlr_run_exports_in_the_official_cola_layout_and_imports_back_as_the_same_function(data):
    """The official code's names and shapes (cola_a: d_in x r, cola_b: r x d_out per projection, ColaConfig's rank),
    DLR folded into B; imported back, the model computes what the run's does."""
    from safetensors.torch import load_file
    run(data, 'train.py', *TINY_TRAIN, '--dlr_alpha=1.0', '--data_dir=data', '--out_dir=dlr-run', '--max_iters=2',
        '--eval_interval=2')
    run(data, 'export.py', '--out_dir=dlr-run', '--export_dir=dlr-hf')
    config = json.loads((data / 'dlr-hf' / 'config.json').read_text())
    assert (config['architectures'], config['model_type'], config['rank']) == (['ColaForCausalLM'], 'cola', 16)
    ours = model_from_checkpoint(load_checkpoint(data / 'dlr-run' / 'ckpt.pt')).eval()
    weights = load_file(str(data / 'dlr-hf' / 'model.safetensors'))
    layer = ours.blocks[1].mlp.down_proj
    torch.testing.assert_close(weights['model.layers.1.mlp.down_proj.cola_a'], layer.A.detach())
    torch.testing.assert_close(weights['model.layers.1.mlp.down_proj.cola_b'], (layer.B + layer.dlr_residual).detach())
    # the same folder through transformers with the modeling code it carries (ours): the run's logits
    from transformers import AutoModelForCausalLM
    theirs = AutoModelForCausalLM.from_pretrained(str(data / 'dlr-hf'), trust_remote_code=True).eval()
    assert type(theirs).__name__ == 'NanoCoLAForCausalLM' and (data / 'dlr-hf' / 'modeling_nanocola.py').exists()
    idx = torch.randint(0, ours.config.vocab_size, (2, ours.config.block_size))
    with torch.no_grad():
        torch.testing.assert_close(theirs(idx).logits, ours(idx)[0], rtol=1e-5, atol=2e-5)
    run(data, 'export.py', '--import_dir=dlr-hf', '--out_dir=dlr-back', '--encoding=byte')
    back = model_from_checkpoint(load_checkpoint(data / 'dlr-back' / 'ckpt.pt')).eval()
    with torch.no_grad():
        torch.testing.assert_close(back(idx)[0], ours(idx)[0], rtol=1e-5, atol=1e-5)


def test_elas_and_an_existing_export_dir_are_refused_in_one_line(data):
    run(data, 'train.py', *TINY_TRAIN, '--mlp=elas', '--data_dir=data', '--out_dir=elas-run', '--max_iters=2',
        '--eval_interval=2')
    refused(run(data, 'export.py', '--out_dir=elas-run', '--export_dir=elas-hf', check=False),
            "ELAS's MLP and Low-Rank's linear factors are neither Llama's nor the official CoLA code's layers")
    (data / 'taken').mkdir()
    (data / 'taken' / 'config.json').write_text(json.dumps({'a user': 'file'}))
    refused(run(data, 'export.py', '--out_dir=elas-run', '--export_dir=taken', check=False),
            "export_dir='taken' already exists and is not an empty folder: nothing is overwritten")
    assert json.loads((data / 'taken' / 'config.json').read_text()) == {'a user': 'file'}


def test_an_exported_run_imports_back_bit_for_bit_and_trains_on(data):
    run(data, 'train.py', *TINY_TRAIN, '--rank=0', '--data_dir=data', '--out_dir=round', '--max_iters=2', '--eval_interval=2')
    run(data, 'export.py', '--out_dir=round', '--export_dir=round-hf')
    run(data, 'export.py', '--import_dir=round-hf', '--out_dir=round-back')  # the export says its encoding: byte
    before = load_checkpoint(data / 'round' / 'ckpt.pt')['model']
    after = load_checkpoint(data / 'round-back' / 'ckpt.pt')
    assert after['iter_num'] == 0 and after['encoding'] == 'byte' and before.keys() == after['model'].keys()
    assert all(torch.equal(before[k], after['model'][k]) for k in before)  # the round trip is exact
    r = run(data, 'train.py', *TINY_TRAIN, '--rank=0', '--data_dir=data', '--out_dir=round-back', '--init_from=resume',
            '--max_iters=2', '--eval_interval=2')
    assert 'resumed from round-back/ckpt.pt at iter 0' in r.stdout
    assert train_log(data / 'round-back')[1][0] == train_log(data / 'round')[1][2]  # the same model, the same val loss
    refused(run(data, 'export.py', '--import_dir=round-hf', '--out_dir=round-back', '--encoding=byte', check=False),
            'round-back/ckpt.pt exists: nothing is overwritten')
    (data / 'bare-hf').mkdir()  # a Llama folder of another origin, without a tokenizer
    (data / 'bare-hf' / 'model.safetensors').write_bytes((data / 'round-hf' / 'model.safetensors').read_bytes())
    config = json.loads((data / 'round-hf' / 'config.json').read_text())
    (data / 'bare-hf' / 'config.json').write_text(json.dumps({k: v for k, v in config.items() if k != 'nanocola_encoding'}))
    refused(run(data, 'export.py', '--import_dir=bare-hf', '--out_dir=bare-back', check=False),
            "import_dir='bare-hf' holds no tokenizer: give --encoding= the data's")


TEXTS = ["ROMEO:\nBut soft!  What light", "n\u00e9 \u4f60\u597d \u00ff\x00\x7f<|endoftext|>\n\n x", "  leading spaces, 'quotes' 123"]


@pytest.mark.parametrize('encoding', ['byte', pytest.param('gpt2', marks=needs_gpt2)])
def test_the_exported_tokenizer_gives_the_runs_own_tokens(encoding, tmp_path):
    """What lm-eval's hf model and every transformers user encode with: the same ids as the run's encoding, text in
    a text that looks like a special token included, and back to the same text."""
    from transformers import AutoTokenizer

    from export import hf_tokenizer
    from shards import get_encoding
    hf_tokenizer(encoding).save_pretrained(tmp_path)
    theirs, ours = AutoTokenizer.from_pretrained(str(tmp_path)), get_encoding(encoding)
    for text in TEXTS:
        ids = ours.encode_to_numpy(text, disallowed_special=()).tolist()
        assert theirs.encode(text) == ids and theirs.decode(ids) == text
    assert theirs.eos_token_id == ours.eot_token


def llama_folder(folder, **settings):
    """A small random Llama saved by the installed transformers itself (5.x: rope_theta in rope_parameters)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                         max_position_embeddings=32, **settings)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    return model


def test_an_imported_llama_keeps_its_rope_theta_wherever_transformers_writes_it(tmp_path):
    import export
    theirs = llama_folder(tmp_path / 'llama', rope_theta=5e5)
    assert 'rope_parameters' in json.loads((tmp_path / 'llama' / 'config.json').read_text())  # transformers 5's layout
    ours, _ = export.import_llama(str(tmp_path / 'llama'))
    assert ours.config.rope_theta == 5e5
    idx = torch.randint(0, 64, (2, 32))
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(idx)[0], theirs(idx).logits, rtol=1e-5, atol=1e-5)
    config = json.loads((tmp_path / 'llama' / 'config.json').read_text())  # transformers 4's layout: at the top
    config['rope_theta'] = config.pop('rope_parameters')['rope_theta']
    (tmp_path / 'llama' / 'config.json').write_text(json.dumps(config))
    assert export.import_llama(str(tmp_path / 'llama'))[0].config.rope_theta == 5e5


@pytest.mark.parametrize('settings,message', [
    (dict(attention_bias=True), "attention_bias=True: nanoCoLA's model has no biases"),
    (dict(mlp_bias=True), "mlp_bias=True: nanoCoLA's model has no biases"),
    (dict(rope_scaling={'rope_type': 'linear', 'factor': 2.0}), "rope_parameters={'factor': 2.0, "),
    (dict(head_dim=8), 'head_dim=8: nanoCoLA\'s model has hidden_size / num_attention_heads (64 / 4)'),
    (dict(num_key_value_heads=2), 'num_key_value_heads=2: nanoCoLA\'s model has one KV head per query head (4)'),
    (dict(tie_word_embeddings=True), "tie_word_embeddings=True: nanoCoLA's model has an output layer of its own"),
    (dict(hidden_act='gelu'), "hidden_act='gelu'"),
])
def test_an_import_refuses_in_one_line_each_setting_the_model_lacks(tmp_path, settings, message):
    llama_folder(tmp_path / 'llama', **settings)
    refused(run(tmp_path, 'export.py', '--import_dir=llama', '--out_dir=back', '--encoding=byte', check=False), message)
    assert not (tmp_path / 'back').exists()
    config = json.loads((tmp_path / 'llama' / 'config.json').read_text())
    if 'rope_scaling' in settings:  # transformers 4 wrote it at the top level
        config['rope_scaling'], config['rope_parameters'] = {'type': 'linear', 'factor': 2.0}, {'rope_theta': 1e4}
        (tmp_path / 'llama' / 'config.json').write_text(json.dumps(config))
        refused(run(tmp_path, 'export.py', '--import_dir=llama', '--out_dir=back', '--encoding=byte', check=False),
                "rope_scaling={'type': 'linear', 'factor': 2.0}: nanoCoLA's model has plain RoPE")


def test_the_imports_printed_train_command_runs_as_printed(data):
    import shlex
    run(data, 'train.py', *TINY_TRAIN, '--data_dir=data', '--out_dir=printed', '--max_iters=2', '--eval_interval=2')
    run(data, 'export.py', '--out_dir=printed', '--export_dir=printed-hf')
    r = run(data, 'export.py', '--import_dir=printed-hf', '--out_dir=printed-back', '--data_dir=data', '--max_iters=2')
    command = shlex.split(r.stdout.splitlines()[1])
    assert command[:2] == ['python', 'train.py'] and '--max_iters=2' in command and '--rank=16' in command
    trained = run(data, 'train.py', *command[2:])  # as printed, with the repository's train.py
    assert 'resumed from printed-back/ckpt.pt at iter 0' in trained.stdout and 'done: 2 steps' in trained.stdout
