"""
nanoGPT-style configuration: a script keeps its settings as plain module-level variables, then

    configure(globals(), sys.argv[1:])

applies, in order, config files (python files of plain assignments) and --key=value overrides:

    python train.py config/cola_60m.py --batch_size=32 --compile_model=False
    python bench.py --as_json                   # a bare --flag sets a boolean setting to True
    python train.py --help                      # the script's docstring, every setting, its default and meaning

Every key must already exist in the script, and an override must have the type of the value it
replaces (an int may stand for a float; a setting whose default is None takes anything), so a typo
fails loudly instead of being silently ignored.
"""

import math
import os
import re
import sys
import traceback
from ast import literal_eval


def read_config_file(path):
    """The assignments of a config file, as a dict."""
    if not os.path.isfile(path):
        raise SystemExit(f"config file {path!r} not found")
    values = {}
    try:
        exec(compile(open(path, encoding='utf-8').read(), path, 'exec'), {}, values)
    except UnicodeDecodeError as e:
        raise SystemExit(f"config file {path!r} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    except Exception as e:  # a config file is Python the user wrote: its error, in one line, with its line
        line = next((f.lineno for f in reversed(traceback.extract_tb(e.__traceback__)) if f.filename == path),
                    getattr(e, 'lineno', '?'))
        raise SystemExit(f"config file {path!r}, line {line}: {type(e).__name__}: {e}") from None
    return {k: v for k, v in values.items() if not k.startswith('_')}


def _checked(key, value, default, source):
    if isinstance(value, float) and not math.isfinite(value):
        raise SystemExit(f"{source}: {key}={value!r}: expected a finite number")
    if default is None or type(value) is type(default):
        return value
    if type(default) is float and type(value) is int:
        return float(value)
    article = lambda t: 'None' if t is type(None) else ('an ' if t.__name__[0] in 'aeiou' else 'a ') + t.__name__  # noqa: E731
    raise SystemExit(f"{source}: {key}={value!r} is {article(type(value))}, expected {article(type(default))}")


def configure(settings, argv):
    """Apply config files and --key=value overrides from argv to the dict settings, in place; --help
    (or -h) prints the script's docstring and its settings with their defaults, and exits."""
    if '--help' in argv or '-h' in argv:
        main = sys.modules['__main__']
        print((main.__doc__ or '').strip())
        print('\nSettings (--key=value, or a config file of such assignments), with their defaults and meanings:')
        meanings = setting_comments(getattr(main, '__file__', None))
        for key, value in settings.items():
            print(f'  --{key}={value!r}'.ljust(34) + (f'  {meanings[key]}' if key in meanings else ''))
        raise SystemExit(0)
    for arg in argv:
        if not arg.startswith('--'):
            for key, value in read_config_file(arg).items():
                if key not in settings:
                    raise SystemExit(f"{arg}: unknown setting {key!r}")
                settings[key] = _checked(key, value, settings[key], arg)
            continue
        if '=' not in arg and isinstance(settings.get(arg[2:]), bool):
            arg += '=True'  # a bare --flag switches a boolean setting on
        if '=' not in arg:
            raise SystemExit(f"argument {arg!r}: expected --key=value or a config file")
        key, text = arg[2:].split('=', 1)
        if key not in settings:
            raise SystemExit(f"--{key}: unknown setting; known: {', '.join(sorted(settings))}")
        try:
            value = literal_eval(text)
        except (SyntaxError, ValueError):
            value = text  # a bare word is a string: --device=cuda
        settings[key] = _checked(key, value, settings[key], f'--{key}')
    return settings


def setting_comments(path):
    """The comment beside each module-level setting of a script (`name = value  # comment`): its meaning, with the
    comment-only lines right below it that continue it (`#` then the spaces that line them up)."""
    if not path or not os.path.isfile(path):
        return {}
    found, last = {}, None  # name -> (indentation, comment): an unindented setting wins over one under `if __name__ ...`
    for line in open(path, encoding='utf-8'):
        m = re.match(r"^( *)(\w+) = .*?  # (.*)$", line)
        more = re.match(r"^( *)#  +(\S.*)$", line)
        if m and len(m.group(1)) < found.get(m.group(2), (99,))[0]:
            found[m.group(2)], last = (len(m.group(1)), m.group(3)), m.group(2)
        elif more and last and len(more.group(1)) == found[last][0]:
            found[last] = found[last][0], found[last][1] + ' ' + more.group(2)
        else:
            last = None
    return {name: comment for name, (_, comment) in found.items()}


def public_settings(namespace):
    """The settings of a script: its module-level names of plain types, but for CONSTANTS."""
    return {k: v for k, v in namespace.items()
            if not k.startswith('_') and not k.isupper() and (v is None or isinstance(v, (int, float, bool, str, tuple)))}
