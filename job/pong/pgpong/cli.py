"""The command line of every program here, the trainer's and each tool's: a mistake is one line and exit 2.

    p = cli.Parser(prog="python -m pongtools.play")
    p.add_argument("--games", type=cli.at_least(1), default=3)   # --games 0: "must be a whole number >= 1"
    ...
    cli.fail("no checkpoint at /x; pass CHECKPOINT=...")           # a mistake found after parsing

A flag the parser refuses prints `<prog>: error: <what was wrong> (see --help)`, not argparse's
usage block; fail() prints `error: <message>`, or `<prog>: <message>` for a program whose lines
carry its name (submit, preflight). Both exit with status 2.
"""

import argparse
import sys


class Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line; its subcommands' parsers are of this class too."""

    def error(self, message):
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        sys.exit(2)


def fail(message, prog=None):
    """A mistake the user can fix, found after the flags were parsed: one line on stderr, exit 2.
    The line starts with `error:`, or with `<prog>:` when prog is given."""
    print(f"{prog or 'error'}: {message}", file=sys.stderr)
    sys.exit(2)


def checked(convert, wanted):
    """An argparse type from `convert` (text -> value, ValueError if unusable) whose error says
    what was wanted: `argument --games: must be a whole number >= 1, not '0'`."""

    def parse(text):
        try:
            return convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {wanted}, not {text!r}") from None

    return parse


def whole(text, minimum=0):
    """A whole number >= minimum, or ValueError."""
    value = int(text)
    if value < minimum:
        raise ValueError
    return value


def positive(text):
    """A finite number > 0, or ValueError."""
    value = float(text)
    if not 0 < value < float("inf"):
        raise ValueError
    return value


def non_negative(text):
    """A finite number >= 0, or ValueError."""
    value = float(text)
    if not 0 <= value < float("inf"):
        raise ValueError
    return value


def at_least(minimum):
    """An argparse type: a whole number >= minimum."""
    return checked(lambda text: whole(text, minimum), f"a whole number >= {minimum}")
