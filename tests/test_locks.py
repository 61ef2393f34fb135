"""The locks requirements*.txt agree with the inputs requirements*.in they are made from.

`make lock` writes each lock with `uv pip compile` from the .in file of the same name;
the venv (make setup), the image and the offline wheelhouse install only the locks. A
lock is out of date when someone edits an input and forgets `make lock`: a pin changed,
a package added or removed, an extra asked for. These tests read both files, with
`packaging` (through infra/check_image.py's read_lock, the same reader the image's own
check uses), and need no network.
"""

import importlib.metadata
import re

import pytest
from harness import REPO
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from infra.check_image import read_lock

INPUTS = sorted(REPO.glob("requirements*.in"))


def lock_of(path):
    return path.with_suffix(".txt")


def read_input(path):
    """The requirements of an input file (one per line; comments and blank lines aside)."""
    requirements = []
    for line in path.read_text().splitlines():
        text = line.split("#", 1)[0].strip()
        if text:
            assert not text.startswith("-"), (
                f"{path.name}: options such as {text!r} belong in the Makefile's lock target"
            )
            requirements.append(Requirement(text))
    return requirements


def test_every_input_has_its_lock_and_make_lock_writes_it():
    assert {p.name for p in INPUTS} == {
        "requirements.in",
        "requirements-tools.in",
        "requirements-test.in",
        "requirements-uv.in",
    }
    makefile = (REPO / "Makefile").read_text()
    for path in INPUTS:
        assert lock_of(path).is_file(), f"{lock_of(path).name} is missing; run `make lock`"
        assert re.search(rf"^\t\$\(LOCK\) {re.escape(path.name)} .*-o {re.escape(lock_of(path).name)}$", makefile, re.M)


@pytest.mark.parametrize("path", INPUTS, ids=lambda p: p.name)
def test_every_locked_package_is_pinned_and_hashed(path):
    entries = read_lock(lock_of(path))
    assert entries
    for entry in entries:
        (spec,) = entry.requirement.specifier
        assert spec.operator == "==", entry.requirement
        assert entry.hashes and all(h.startswith("sha256:") for h in entry.hashes), entry.requirement


@pytest.mark.parametrize("path", INPUTS, ids=lambda p: p.name)
def test_the_lock_is_up_to_date_with_its_input(path):
    wanted = read_input(path)
    entries = read_lock(lock_of(path))
    redo = f"{lock_of(path).name} is out of date with {path.name}; run `make lock`"
    # The packages the lock says the input asked for are exactly those the input names.
    direct = {e.name for e in entries if f"-r {path.name}" in e.via}
    assert direct == {canonicalize_name(r.name) for r in wanted}, redo
    locked = {}
    for entry in entries:
        locked.setdefault(entry.name, []).append(entry)
    for requirement in wanted:
        name = canonicalize_name(requirement.name)
        versions = [e.version for e in locked[name]]
        assert any(requirement.specifier.contains(v, prereleases=True) for v in versions), (redo, requirement, versions)
        # What the package needs for the extras asked for (ray[default], moto[server]):
        # read from the package's metadata where the venv has the locked version.
        try:
            installed = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if Version(installed.version) not in versions:
            continue
        for extra in requirement.extras:
            for dependency in map(Requirement, installed.requires or []):
                if dependency.marker and dependency.marker.evaluate({"extra": extra}):
                    assert canonicalize_name(dependency.name) in locked, (redo, f"{requirement} needs {dependency}")


def test_a_package_in_several_locks_has_one_version():
    """The venv installs the locks one over another: shared packages must agree."""
    seen = {}
    for path in INPUTS:
        for entry in read_lock(lock_of(path)):
            if entry.applies():
                seen.setdefault(entry.name, {})[lock_of(path).name] = entry.version
    split = {name: where for name, where in seen.items() if len(set(where.values())) > 1}
    assert not split, f"run `make lock`: {split}"
