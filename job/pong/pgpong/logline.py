"""Log lines are `key=value` pairs, so `ray job logs` can be grepped and parsed.

Every program here writes its lines with kv() and every reader reads them with fields():

    kv("done", updates=2, seconds=12.3456, source="AWS list prices, 2025")
    -> 'done updates=2 seconds=12.35 source="AWS list prices, 2025"'

A value that holds whitespace (or starts with `"`) is written in double quotes, with `"` and
`\\` escaped inside, as a shell reads it. Any other value is written as it is, `=` and `"`
included: the trainer's start line carries its config as JSON and its thread presets as
`NAME=1,...`, and a key is everything up to its word's first `=`.
"""

import re
import resource

_FIELD = re.compile(r'(?:^|\s)([^\s=]+)=("(?:[^"\\]|\\.)*"(?=\s|$)|\S*)')


def value(v):
    """One value as kv writes it: a float to 4 significant digits (whole from 1e4 on), in quotes if it
    holds whitespace or starts with a quote."""
    if isinstance(v, float):
        text = f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
    else:
        text = str(v)
    if any(c.isspace() for c in text) or text.startswith('"'):
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return text


def kv(*words, **fields):
    """One log line: the bare words, then key=value pairs in the order given."""
    return " ".join([*words, *(f"{k}={value(v)}" for k, v in fields.items())])


def fields(line):
    """{'updates': '2', ...}: the key=value pairs of one line kv wrote, a quoted value unquoted."""
    found = {}
    for key, text in _FIELD.findall(line):
        if text.startswith('"') and len(text) > 1 and text.endswith('"'):
            text = re.sub(r"\\(.)", r"\1", text[1:-1])
        found[key] = text
    return found


def peak_rss_mb():
    """This process's peak resident memory, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
