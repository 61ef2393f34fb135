"""Log lines are `key=value` pairs, so `ray job logs` can be grepped and parsed."""

import resource


def kv(*words, **fields):
    """One log line: the bare words, then key=value pairs in the order given."""

    def fmt(v):
        if isinstance(v, float):
            return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
        return str(v)

    return " ".join([*words, *(f"{k}={fmt(v)}" for k, v in fields.items())])


def peak_rss_mb():
    """This process's peak resident memory, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
