"""Each thing where its name says (docs/development.md, Layout): the top level, docs/ for pages and
pictures, run data in job/tools/runs/ with at most one full checkpoint, which package may
import which, and the tests by role (tests/harness/ for what tests import, conftest.py for
fixtures and hooks)."""

import ast
import json
import re
import subprocess
import zipfile

from harness import REPO

TOP_LEVEL = {"cluster", "job", "infra", "tests", "docs", ".ci", "Makefile", "README.md", "pyproject.toml", "LICENSE"}
TOP_LEVEL |= {".gitignore"}
PICTURES = (".png", ".gif", ".jpg", ".svg")


def tree():
    """The files the tree holds: tracked ones, and new ones git would not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return [f for f in listed.stdout.splitlines() if (REPO / f).exists()]


def test_the_top_level_is_cluster_job_infra_tests_docs_and_the_project_files():
    tops = {f.split("/", 1)[0] for f in tree()}
    strays = {t for t in tops - TOP_LEVEL if not t.startswith("requirements")}
    assert not strays, f"the top level holds only {sorted(TOP_LEVEL)} and the locks: move {sorted(strays)}"


def test_job_holds_the_shipped_job_and_the_tools_package_only():
    """What Ray ships is job/pong alone; the laptop's programs are modules of pongtools (job/tools), none a loose
    script under job/."""
    under_job = {f.split("/")[1] for f in tree() if f.startswith("job/")}
    assert under_job == {"pong", "tools"}, f"job/ holds pong/ (the job) and tools/ (pongtools), not {sorted(under_job)}"


def test_no_code_edits_the_import_path():
    """pgpong and pongtools are installed (make setup; pyproject.toml), the tests' harness and the scripts they
    import are on pytest's pythonpath (pyproject.toml): no sys.path edit anywhere, no PYTHONPATH in the Makefile."""
    edit = re.compile(r"sys\.path\s*(\.(insert|append|extend)|\[|\+?=)")
    edits = [f for f in tree() if f.endswith(".py") and edit.search((REPO / f).read_text())]
    assert not edits, f"import installed packages instead of editing sys.path: {edits}"
    makefile = (REPO / "Makefile").read_text()
    assert "PYTHONPATH" not in makefile, "the Makefile runs the installed packages: no PYTHONPATH"


def test_docs_hold_pages_pictures_and_saved_samples_only():
    docs = [f for f in tree() if f.startswith("docs/")]
    others = [
        f
        for f in docs
        if not (f.count("/") == 1 and f.endswith(".md")) and not f.startswith(("docs/images/", "docs/samples/"))
    ]
    others += [f for f in docs if f.startswith("docs/images/") and not f.endswith(PICTURES)]
    # a slow sample's saved output, which a page's cog block reads (pongtools.samples.saved)
    others += [f for f in docs if f.startswith("docs/samples/") and not (f.count("/") == 2 and f.endswith(".txt"))]
    assert not others, f"run data goes to job/tools/runs/, not docs/: {others}"


def test_the_tree_holds_at_most_one_full_checkpoint():
    """A full checkpoint (weights and RMSProp cache, 10 MB) can resume a run; an exported agent holds
    float16 weights alone. The tree keeps one of the former at a time, whatever its name."""
    full = []
    for f in tree():
        if f.endswith(".npz"):
            with zipfile.ZipFile(REPO / f) as z:
                members = z.namelist()
            if any(m.startswith("cache/") for m in members):
                full.append(f)
    assert len(full) <= 1, f"more than one full checkpoint in the tree: {full}"
    assert all(f.startswith("job/tools/runs/") for f in full), full


def imports(path, top_only=False):
    """The top-level package of every module a Python file imports (at the top or in a function; with
    top_only, at the top: what importing the file imports)."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in tree.body if top_only else ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_the_job_never_imports_the_tools_and_neither_imports_infra():
    infra = {p.stem for p in (REPO / "infra").glob("*.py")}  # preflight, check_image
    wrong = []
    for path in sorted((REPO / "job").rglob("*.py")):
        bad = imports(path) & (infra | ({"pongtools"} if "job/pong/" in str(path) else set()))
        wrong += [f"{path.relative_to(REPO)} imports {sorted(bad)}"] if bad else []
    assert not wrong, wrong


def test_the_heads_programs_need_nothing_of_the_laptops_tools():
    """What the YAMLs run on a head from infra/ (the autodown watcher, the autoscaler's scorer) imports the job's
    package at most, never pongtools, and no YAML copies pongtools to its nodes: the head has what it needs on
    purpose (pgpong.raystart, pgpong.cli), not the laptop's tools by accident."""
    import yaml

    on_the_head = [REPO / "infra" / "autodown.py", *sorted((REPO / "infra" / "autoscaler").glob("*.py"))]
    wrong = [f"{p.relative_to(REPO)} imports pongtools" for p in on_the_head if "pongtools" in imports(p)]
    for path in sorted((REPO / "cluster").glob("*.yaml")):
        mounts = yaml.safe_load(path.read_text())["file_mounts"]
        wrong += [f"{path.name} copies {local} to the nodes" for local in mounts.values() if "job/tools" in local]
    assert not wrong, wrong


def test_every_kept_run_reads_as_a_run():
    """Each folder of job/tools/runs/ holds metrics and weights, or a comparison run's run.json
    (pongtools.ship --metrics-only), that a tool can read (make plot RUN=...)."""
    from pgpong.rundir import RUN_RECORD, RunDir

    kept = lambda f: f.endswith(".npz") or f.endswith("/" + RUN_RECORD)  # noqa: E731
    runs = sorted({(REPO / f).parent for f in tree() if f.startswith("job/tools/runs/") and kept(f)})
    assert len(runs) >= 11, runs  # the shipped agent, nine learning-rate runs, the winning run
    for folder in runs:
        run = RunDir(folder)
        records = run.metrics()
        config, _ = run.config()
        assert records and records[-1]["update"] >= 1 and config.get("batch_size") == records[0]["episodes"], folder
    rates = json.loads((REPO / "job/pong/pgpong/learning_rates.json").read_text())
    assert {REPO / r["run"] for r in rates["runs"]} <= set(runs)


def test_every_run_record_counts_what_its_metrics_hold():
    """A kept run's run.json (pongtools.ship --metrics-only) holds the counters of its last update: as many
    updates, episodes and env steps as its metrics, and one RMSProp step an update (train.py steps once each)."""
    from pgpong.rundir import RUN_RECORD, RunDir

    records = sorted((REPO / f).parent for f in tree() if f.startswith("job/tools/runs/") and f.endswith(RUN_RECORD))
    assert len(records) >= 11, records
    wrong = []
    for folder in records:
        record = json.loads((folder / RUN_RECORD).read_text())
        metrics = RunDir(folder).metrics()
        counted = {
            "update": metrics[-1]["update"],
            "episodes": sum(m["episodes"] for m in metrics),
            "env_steps": sum(m["env_steps"] for m in metrics),
            "rmsprop_steps": metrics[-1]["update"],
        }
        wrong += [
            f"{folder.relative_to(REPO)}: {k}={record[k]}, its metrics: {v}"
            for k, v in counted.items()
            if record[k] != v
        ]
    assert not wrong, "\n".join(wrong)


def test_no_test_module_imports_another_nor_conftest():
    """What tests share is in tests/harness/, by role; a test module or the harness that imports a test
    module (or conftest.py, which pytest imports itself) chains the tests together again."""
    tests = REPO / "tests"
    modules = {p.stem for p in tests.glob("test_*.py")} | {"conftest"}
    wrong = []
    for path in sorted([*tests.glob("*.py"), *(tests / "harness").rglob("*.py")]):
        bad = imports(path) & modules
        wrong += [f"{path.relative_to(REPO)} imports {sorted(bad)}"] if bad else []
    assert not wrong, f"move what they share into tests/harness/: {wrong}"


def is_hook_or_fixture(node):
    """A pytest hook (pytest_*) or a function under @pytest.fixture."""
    decorators = [d.func if isinstance(d, ast.Call) else d for d in node.decorator_list]
    fixture = any(ast.unparse(d) in ("pytest.fixture", "fixture") for d in decorators)
    return isinstance(node, ast.FunctionDef) and (node.name.startswith("pytest_") or fixture)


def test_conftest_holds_only_fixtures_and_hooks():
    """A plain function or class in conftest.py belongs in tests/harness/; pytest's hooks and fixtures stay.
    (Functions inside a fixture are its own.)"""
    module = ast.parse((REPO / "tests" / "conftest.py").read_text())
    defined = [n for n in module.body if isinstance(n, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)]
    plain = [n.name for n in defined if not is_hook_or_fixture(n)]
    assert not plain, f"conftest.py holds fixtures and hooks only; move these to tests/harness/: {plain}"


def test_the_harness_imports_neither_numpy_nor_ray_at_its_top():
    """conftest.py sets the suite's environment (token auth, thread presets) in pytest_configure, after it
    and the harness are imported and before any test module is: Ray and OpenBLAS read it when first imported."""
    early = [REPO / "tests" / "conftest.py", *sorted((REPO / "tests" / "harness").rglob("*.py"))]
    wrong = []
    for path in early:
        bad = imports(path, top_only=True) & {"numpy", "ray", "pgpong", "pongtools"}
        wrong += [f"{path.relative_to(REPO)} imports {sorted(bad)}"] if bad else []
    assert not wrong, f"import these inside the functions that use them: {wrong}"
