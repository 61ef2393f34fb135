"""The command line of every program here, the trainer's and each tool's: one exit contract.

    def main(argv=None):
        p = cli.Parser(prog="python -m pongtools.play")
        p.add_argument("--games", type=cli.at_least(1), default=3)  # --games 0: "must be a whole number >= 1"
        ...
        raise cli.UserError("no checkpoint at /x; pass CHECKPOINT=...")  # a mistake found after parsing

    def entry():  # what `python -m` runs: `if __name__ == "__main__": entry()`
        cli.run(main)

run() is the one place a program's end becomes its exit status: main's own status (None: 0); a
UserError, a mistake the user can fix, one line `error: <message>` (or `<prog>: <message>` for a
program whose lines carry its name: submit, jobs, preflight) and 2; a Failure, something that stopped
the program by no fault of the user's and that it can say (AWS out of reach, a run dir that stopped
taking writes), one line the same way and 1; Ctrl-C 130; a reader that left (`| head`) 141, quietly; any
other exception, a bug, its traceback and 1. Through make, any of these but 0 is make's own exit 2; the program's status is the N of
make's `make: *** [Makefile:L: target] Error N` line. A flag the parser refuses prints `<prog>: error: <what was wrong>
(see --help)`, not argparse's usage block, and exits 2 as well.
"""

import argparse
import os
import sys
import traceback

MISTAKE, FAILURE, INTERRUPTED, BROKEN_PIPE = 2, 1, 130, 141  # 141: 128 + SIGPIPE, as a shell's


class UserError(Exception):
    """A mistake the user can fix (a flag, a file, a name), said in one line that says what to do: exit 2."""


class Failure(Exception):
    """Something stopped the program by no fault of the user's, said in one line that says what was kept: exit 1."""


class Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line; its subcommands' parsers are of this class too. variables: {a flag's
    dest: the make variable that passes it} (a program the Makefile runs): a refused value is then named as the user
    typed it, `NODES=0: must be a whole number >= 1`, not by the flag."""

    def __init__(self, *args, variables=None, **kwargs):
        self.variables = variables or {}
        super().__init__(*args, **kwargs)

    def _get_value(self, action, text):
        try:
            return super()._get_value(action, text)
        except argparse.ArgumentError as e:
            raise self._named(action, text, e) from None

    def _check_value(self, action, value):
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as e:
            raise self._named(action, value, e) from None

    def _named(self, action, text, error):
        """error as said of the make variable that passed the value, if any."""
        name = self.variables.get(action.dest)
        if not name:
            return error
        why = error.message.removesuffix(f", not {text!r}")
        return argparse.ArgumentError(None, f"{name}={text}: {why}{VARIABLE_MARK}")

    def error(self, message):
        if message.endswith(VARIABLE_MARK):
            sys.stderr.write(f"{self.prog}: error: {message.removesuffix(VARIABLE_MARK)}\n")
        else:
            sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        sys.exit(MISTAKE)


# What ends a refusal that names a make variable: its line then asks for no --help (a make user typed no flag).
VARIABLE_MARK = "\x00"


def fail(message):
    """A mistake found after the flags were parsed: raises the UserError that run() makes one line and exit 2."""
    raise UserError(message)


def status(main, argv=None, prog=None):
    """main(argv)'s exit status under the contract above, its one line (a UserError) or traceback printed."""
    try:
        return main(argv) or 0
    except UserError as error:
        print(f"{prog or 'error'}: {error}", file=sys.stderr, flush=True)
        return MISTAKE
    except Failure as error:
        print(f"{prog or 'error'}: {error}", file=sys.stderr, flush=True)
        return FAILURE
    except KeyboardInterrupt:
        return INTERRUPTED
    except BrokenPipeError:  # its reader left (`| head`): nothing more to say, no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so Python's own flush at exit is quiet
        return BROKEN_PIPE
    except Exception:  # noqa: BLE001 (every other exception is a failure: its traceback, exit 1)
        traceback.print_exc()
        return FAILURE


def run(main, prog=None):
    """Run a program's main(argv=None) and exit with its status (see status)."""
    sys.exit(status(main, None, prog))


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
