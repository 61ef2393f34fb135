"""Checks, inside the image, what every node needs before a job can run.

Run at build time by infra/Dockerfile (a failure stops the build) and by hand with
`docker run --rm IMAGE python /opt/pong/check_image.py`. Checks that every package of
the lock requirements.txt that applies here is installed at its locked version, that
Pong starts, and that the thread presets are set. Prints key=value lines:

    check_image lock=requirements.txt packages=69 mismatched=0 ray=2.60.0 gymnasium=1.4.0 ...
    check_image env=Pong-v0 obs=210x160x3 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 ...

read_lock() is also what tests/test_locks.py reads the locks with.
"""

import importlib.metadata
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

LOCK = Path(__file__).with_name("requirements.txt")
THREAD_VARS = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS")


@dataclass
class Locked:
    """One package of a lock: `name==version ; marker`, its hashes, and what asked for it."""

    requirement: Requirement
    hashes: list = field(default_factory=list)
    via: list = field(default_factory=list)

    @property
    def name(self):
        return canonicalize_name(self.requirement.name)

    @property
    def version(self):
        (spec,) = self.requirement.specifier  # a lock pins each package with one ==
        return Version(spec.version)

    def applies(self):
        """True where this Python and platform install it (its marker, if any, holds)."""
        return self.requirement.marker is None or self.requirement.marker.evaluate()


def read_lock(path):
    """The packages of a lock written by `uv pip compile --generate-hashes` (make lock).

    Its entries look like this; the requirement itself is parsed by `packaging`:

        cffi==2.1.1 ; platform_python_implementation != 'PyPy' \\
            --hash=sha256:... \\
            --hash=sha256:...
            # via
            #   -r requirements.in
            #   cryptography
    """
    entries = []
    in_via = False
    for line in Path(path).read_text().splitlines():
        text = line.strip().removesuffix("\\").strip()
        if not text:
            continue
        if not line[0].isspace() and not text.startswith("#"):
            entries.append(Locked(Requirement(text)))
            in_via = False
        elif not entries:
            continue  # the header's comments
        elif text.startswith("--hash="):
            entries[-1].hashes.append(text.removeprefix("--hash="))
        elif text.startswith("# via"):
            rest = text.removeprefix("# via").strip()
            entries[-1].via += [rest] if rest else []
            in_via = not rest
        elif in_via and text.startswith("#"):
            entries[-1].via.append(text.removeprefix("#").strip())
    return entries


def check_installed(entries):
    """{name: installed version or 'missing'} and the problems, for the entries that apply here."""
    installed, problems = {}, []
    for entry in entries:
        if not entry.applies():
            continue
        try:
            have = importlib.metadata.version(entry.name)
        except importlib.metadata.PackageNotFoundError:
            have = "missing"
        installed[entry.name] = have
        if have == "missing" or Version(have) != entry.version:
            problems.append(f"{entry.name} is {have}, the lock has {entry.version}")
    return installed, problems


def main():
    entries = read_lock(LOCK)
    installed, problems = check_installed(entries)
    # The packages requirements.in names, in its order of the lock; the rest are counted.
    direct = [e.name for e in entries if e.name in installed and "-r requirements.in" in e.via]
    print(
        f"check_image lock={LOCK.name} packages={len(installed)} mismatched={len(problems)} "
        + " ".join(f"{name}={installed[name]}" for name in direct),
        flush=True,
    )

    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)  # each process must register the ALE envs itself
    env = gym.make("Pong-v0")
    obs, _ = env.reset(seed=0)
    env.close()
    threads = {var: os.environ.get(var, "unset") for var in THREAD_VARS}
    problems += [f"{var}={value}, want 1" for var, value in threads.items() if value != "1"]
    shape = "x".join(str(n) for n in obs.shape)
    print(f"check_image env=Pong-v0 obs={shape} " + " ".join(f"{k}={v}" for k, v in threads.items()))

    for problem in problems:
        print(f"check_image: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
