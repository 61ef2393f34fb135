"""The docs cannot drift from the code: samples, links, section names and saved sample log lines.

    .venv/bin/python -m pytest tests/test_docs.py -q     # the checks (about a minute: real tiny runs)
    .venv/bin/python tests/test_docs.py                  # print fresh sample lines of every kind

cog checks the samples themselves: every block it writes is what its command prints now (`make docs`
with cog --check; the quick ones run again, the slow ones read from docs/samples/), and `make docs`
rewrites them (docs/development.md, The docs). What this file checks, cog cannot:
- every output block of README.md and docs/*.md is one cog writes: a plain fenced block outside a cog
  block is a pasted sample (a hand-written listing is tagged `text`);
- a saved sample goes stale when the code changes a line it shows: every log line of docs/samples/
  whose kind is start, update, trend, done, fault or bench carries exactly the fields the current
  code prints for that kind;
- no page or saved sample names a Makefile line (make's `[Makefile:217: submit]` moves with every
  edit above it);
- each page stays within its length (LIMITS: README.md 250 lines, results.md 300, history.md 250, aws.md
  400, image.md 80, all of them together 2,200), but for the pages over it today, named once in OVER_TODAY;
- README.md's first 40 lines run the project, no table cell of it runs over 120 characters, and every image
  in docs/images/ is shown somewhere, and every saved sample in docs/samples/ is named by a page or the code;
- every relative link, image included, names a file that exists, and every #anchor a
  heading of that file (GitHub's anchor rules);
- every "docs/<file>.md, <Section>" that the code, the Makefile or a doc cites names a
  real heading of that file (the form of the code's error messages).

The expected fields come from the code itself, never from a list in this file: the
trainer and the benchmark are run for real, tiny (batch 2, one update, one actor), and
their lines parsed. Fault lines need a killed actor, so their fields are read from the
`kv("fault", ...)` calls in pgpong/pool.py. Run as a script, this file prints one fresh line of
every kind from a real tiny run.
"""

import ast
import os
import re
import subprocess
import sys
import tempfile

import pytest
from harness import JOB_DIR, REPO, THREADS, clean_env, fields
from harness.cluster import ray_head
from harness.runs import trainer_env

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BATCH_300 = ("b300-lr0.01-d0.94", "b300-lr0.01-d0.94-s1")  # the committed batch-300 runs, seeds 0 and 1
SAVED = sorted((REPO / "docs" / "samples").glob("*.txt"))  # the slow samples' outputs, which cog blocks read
# Files whose text may cite a docs section: the code, the Makefile, configs, the docs.
CITING = [
    *DOCS,
    REPO / "Makefile",
    *sorted(REPO.glob("requirements*.in")),
    *sorted(REPO.glob("requirements*.txt")),
    *sorted(
        p
        for ext in ("py", "sh", "yaml")
        for d in ("job", "cluster", "infra", "tests")
        for p in (REPO / d).rglob(f"*.{ext}")
    ),
]
KINDS = ("start", "update", "trend", "done", "fault", "bench")
# The most lines a page may have, so that each is read in one sitting (issue 46); "all" is README.md and
# every docs/*.md together.
LIMITS = {
    "README.md": 250,
    "docs/results.md": 300,
    "docs/history.md": 250,
    "docs/aws.md": 400,
    "docs/reliability.md": 200,
    "docs/errors.md": 130,
    "docs/monitoring.md": 110,
    "docs/security.md": 40,
    "docs/reference.md": 150,
    "docs/development.md": 140,
    "docs/local-cluster.md": 120,
    "docs/design.md": 50,
    "docs/image.md": 80,
    "all": 2200,
}
# The pages over their limit today, each named once here: remove its entry when the page is cut (an entry
# whose page is within its limit fails too, so that no exception outlives its page's cut).
OVER_TODAY = set()


# -- markdown -------------------------------------------------------------------------


def prose_of(text):
    """The lines outside fenced code blocks, with their numbers."""
    prose, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            prose.append((number, line))
    return prose


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def headings(path):
    """{heading text without markup: anchor} of one markdown file, duplicates numbered as GitHub does."""
    prose = prose_of(path.read_text())
    found, seen = {}, {}
    for _, line in prose:
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found[re.sub(r"[`*]", "", m.group(1)).strip()] = base if n == 0 else f"{base}-{n}"
    return found


LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
IMG = re.compile(r'<img [^>]*src="([^"]+)"')  # an HTML image, as the README's first screen uses


def broken_links(path):
    """Every relative link of one markdown file that names a missing file or anchor."""
    prose = prose_of(path.read_text())
    broken = []
    for number, line in prose:
        code_free = re.sub(r"`[^`]*`", "", line)
        for target in LINK.findall(code_free) + IMG.findall(code_free):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(REPO)}:{number}: {target}"
            if not dest.exists():
                broken.append(f"{where}: no file {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest}")
            elif anchor and dest.suffix == ".md" and anchor not in headings(dest).values():
                broken.append(f"{where}: no heading with anchor #{anchor} in {dest.relative_to(REPO)}")
    return broken


CITATION = re.compile(r"docs/([\w.-]+\.md)[,:] ([A-Z][^)\"'`|,;:\n]*)")


def citations():
    """(where, docs file, section name) for every 'docs/<file>.md, <Section>' in the repo."""
    found = []
    for path in CITING:
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for m in CITATION.finditer(line):
                found.append((f"{path.relative_to(REPO)}:{number}", m.group(1), m.group(2).strip()))
    return found


# -- sample log lines ---------------------------------------------------------------


def line_kind(line):
    """('update', fields) for a log line of one of KINDS, else None.

    bench lines are told apart by their second word: ('bench start', ...),
    ('bench phase=trainer', ...), ('bench summary', ...).
    """
    words = line.split()
    if not words or not fields(line):  # a log line has fields; `  bench  Benchmark ...` of make help has none
        return None
    first = words[0]
    kind = first.split("=", 1)[0]
    if kind not in KINDS:
        return None
    if kind == "bench" and len(words) > 1:
        second = words[1]
        kind = f"bench {second}" if "=" not in second or second.startswith("phase=") else kind
    return kind, frozenset(fields(line))


def saved_samples():
    """(where, kind, fields) for every log line of the saved samples (docs/samples/*.txt)."""
    found = []
    for path in SAVED:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            parsed = line_kind(line)
            if parsed:
                found.append((f"{path.relative_to(REPO)}:{number}", *parsed))
    return found


def pasted_blocks(path):
    """The line numbers of the plain fenced blocks (output) of one page outside its cog blocks."""
    pasted, in_cog, fence = [], False, None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if "[[[cog" in line:
            in_cog = True
        elif "[[[end]]]" in line:
            in_cog = False
        elif line.strip().startswith("```"):
            if fence is None:
                fence = line.strip()[3:].strip()
                if fence == "" and not in_cog:
                    pasted.append(number)
            else:
                fence = None
    return pasted


def run_tiny(env, train_stdout=None):
    """The stdout lines of the real trainer and benchmark, tiny, in env: train_stdout is that of a tiny
    trainer run made already (the suite's tiny_run); without it, the trainer runs here too."""
    if train_stdout is None:
        with tempfile.TemporaryDirectory() as tmp:
            args = ["--batch-size", "2", "--updates", "1", "--workers", "1", "--run-dir", os.path.join(tmp, "run")]
            train = subprocess.run(
                [sys.executable, "-m", "pgpong.train", *args],
                cwd=JOB_DIR,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
        assert train.returncode == 0, train.stdout + train.stderr
        train_stdout = train.stdout
    bench = subprocess.run(
        [
            sys.executable,
            "-m",
            "pongtools.bench",
            "--batch-size",
            "2",
            "--workers",
            "1",
            "--pairs",
            "1",
            "--textbook-episodes",
            "1",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert bench.returncode in (0, 1), bench.stdout + bench.stderr  # 1 = verdict FAIL, still its lines
    return train_stdout.splitlines() + bench.stdout.splitlines()


def fault_field_sets():
    """The keyword sets of every kv("fault", ...) call in pgpong/pool.py."""
    tree = ast.parse((JOB_DIR / "pgpong" / "pool.py").read_text())
    sets = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", None) == "kv"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value == "fault"
        ):
            sets.append(frozenset(k.arg for k in node.keywords))
    return sets


def expected_fields(lines):
    """{kind: [allowed field sets]} from the code's own output (and pool.py for faults)."""
    expected = {}
    for line in lines:
        parsed = line_kind(line)
        if parsed:
            kind, fields = parsed
            allowed = expected.setdefault(kind, [])
            if fields not in allowed:
                allowed.append(fields)
    # A resumed run's start line has one more field, `kept=` (train.py, print_start).
    expected["start"] = expected.get("start", []) + [f | {"kept"} for f in expected.get("start", [])]
    # A stopped run's done line has one more word, `stopped=SIGTERM` (report.py, Summary.line).
    expected["done"] = expected.get("done", []) + [f | {"stopped"} for f in expected.get("done", [])]
    expected["fault"] = fault_field_sets()
    return expected


@pytest.fixture(scope="module")
def expected(tiny_run):
    found = expected_fields(run_tiny(trainer_env(RAY_ADDRESS=ray_head()), tiny_run[0]))  # the bench needs the address
    missing = [k for k in ("start", "update", "trend", "done", "fault") if not found.get(k)]
    assert not missing, f"the tiny runs printed no line of kind {missing}"
    assert any(k.startswith("bench ") for k in found), "the tiny benchmark printed no bench line"
    return found


# -- tests --------------------------------------------------------------------------


def test_every_relative_link_and_anchor_in_the_docs_resolves():
    assert len(DOCS) >= 12, [str(p) for p in DOCS]  # README.md and the eleven pages of docs/
    broken = [b for path in DOCS for b in broken_links(path)]
    assert not broken, "\n".join(broken)


def lengths(docs=DOCS):
    """{page: its line count} of README.md and docs/*.md, and "all": their sum."""
    found = {str(p.relative_to(REPO)): len(p.read_text().splitlines()) for p in docs}
    return found | {"all": sum(found.values())}


def over_limits(found, limits=LIMITS, over_today=OVER_TODAY):
    """What breaks the limits: a page over its limit that is not a known exception, and an exception whose
    page is no longer over (its entry is to be removed)."""
    wrong = []
    for page, limit in limits.items():
        n = found.get(page, 0)
        if n > limit and page not in over_today:
            wrong.append(f"{page}: {n} lines, over its limit of {limit}: cut it or move a section to its own page")
        elif n <= limit and page in over_today:
            wrong.append(f"{page}: {n} lines, within its limit of {limit}: remove it from OVER_TODAY")
    return wrong


def test_each_page_stays_within_its_length():
    found = lengths()
    assert set(LIMITS) - {"all"} <= set(found), f"a limited page is missing: {sorted(set(LIMITS) - set(found))}"
    wrong = over_limits(found)
    assert not wrong, "\n".join(wrong)


def test_the_readme_stays_a_five_minute_read_and_every_image_is_shown():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move a section to docs/ (at most about 250)"
    shown = " ".join(path.read_text() for path in DOCS)
    unused = [p.name for p in sorted((REPO / "docs" / "images").iterdir()) if f"images/{p.name}" not in shown]
    assert not unused, f"docs/images/ holds images no page shows: {unused}"


def test_every_saved_sample_is_read_by_a_page_or_the_code():
    """A sample nothing shows or reads is dead weight that goes stale unseen: remove it (git keeps it). A page
    names it as saved("x"), judge_tables("x") or samples/x.txt, the plan's inputs as docs/samples/x.txt."""
    readers = [*DOCS, REPO / "Makefile", *(p for ext in ("py", "json") for p in (REPO / "job").rglob(f"*.{ext}"))]
    text = "\n".join(p.read_text() for p in readers)
    unread = [s.name for s in SAVED if not re.search(rf"(?<![\w-]){re.escape(s.stem)}(?![\w-])", text)]
    assert len(SAVED) >= 20, [s.name for s in SAVED]
    assert not unread, f"docs/samples/ holds samples no page or code names: {unread}"


def test_the_readmes_first_screen_runs_it_and_its_tables_stay_narrow():
    """The first 40 lines: the pictures, the two commands, the cluster's commands as the design card writes them
    (`ray up`, `make submit JOB=pong`, `ray job logs`, with the line that makes them work in the user's shell)
    and the result; a README table cell over 120 characters belongs in a docs page (the big tables are in
    docs/results.md)."""
    text = (REPO / "README.md").read_text()
    first = "\n".join(text.splitlines()[:40])
    wanted = ["agent-game.gif", "agents-b50-b300.png", "make demo", "make test", "make run", "source cluster/env.sh"]
    wanted += ["ray up -y cluster/aws.yaml", "make submit JOB=pong", "ray job logs <id> --follow"]
    wanted += ["ray down -y cluster/aws.yaml", "**Result.**"]
    assert not [w for w in wanted if w not in first], [w for w in wanted if w not in first]
    prose = prose_of(text)
    wide = [
        f"README.md:{n}: {cell.strip()[:60]}... ({len(cell.strip())} characters)"
        for n, line in prose
        if line.startswith("|")
        for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]
        if len(cell.strip()) > 120
    ]
    assert not wide, "move the table to a docs page or shorten it:\n" + "\n".join(wide)


def test_every_cited_docs_section_exists():
    found = citations()
    assert any(where.startswith(("job/", "Makefile")) for where, _, _ in found), found  # the code's messages
    wrong = []
    for where, name, section in found:
        path = REPO / "docs" / name
        if not path.exists():
            wrong.append(f"{where}: docs/{name} does not exist")
        elif section not in headings(path):
            wrong.append(f"{where}: docs/{name} has no section {section!r}; it has {sorted(headings(path))}")
    assert not wrong, "\n".join(wrong)


def test_every_sample_is_what_its_command_prints_now():
    """cog re-runs the command beside each sample block (quick ones now, slow ones from their saved output in
    docs/samples/) and fails if a block would change: `make docs` rewrites them."""
    cog = subprocess.run(
        ["make", "-s", "docs", "COG_ACTION=--check --diff --check-fail-msg='run make docs and commit the pages'"],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert cog.returncode == 0, cog.stdout[-6000:] + cog.stderr[-3000:]
    pages = [p for p in DOCS if "[[[cog " in p.read_text()]
    assert len(pages) >= 4, f"only {[p.name for p in pages]} carry cog blocks"


def test_every_output_block_is_written_by_cog():
    """A sample is the output of a command the page names beside it: a plain block outside cog's markers was
    pasted by hand, and nothing would tell when it goes stale (docs/development.md, The docs)."""
    pasted = [f"{path.relative_to(REPO)}:{n}" for path in DOCS for n in pasted_blocks(path)]
    assert not pasted, "make these cog blocks (shell, or saved for a slow one) or tag a listing `text`:\n" + "\n".join(
        pasted
    )


def test_no_sample_names_a_makefile_line():
    """make's error line names the Makefile's line (`make: *** [Makefile:217: submit] Error 1`), which moves
    with every edit above it; a sample shows it as pongtools.samples writes it, `make: *** [submit] Error 1`."""
    cited = [
        f"{path.relative_to(REPO)}:{n}: {line.strip()}"
        for path in DOCS + SAVED
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"Makefile:\d+", line)
    ]
    assert not cited, "\n".join(cited)


def test_no_code_or_doc_sends_readers_to_a_readme_section():
    """README.md is short now; sections live in docs/. 'README, Token authentication' is stale."""
    stale = [
        f"{where}"
        for where in (
            f"{p.relative_to(REPO)}:{n}"
            for p in CITING
            if p.name != "test_docs.py"
            for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
            if re.search(r"README[,:] [A-Z]|README's \"|job/pong/README", line)
        )
    ]
    assert not stale, f"cite the section's page instead, as 'docs/security.md, Token authentication': {stale}"


def test_every_saved_sample_log_line_has_exactly_the_fields_the_code_prints(expected):
    """cog re-runs a quick sample; a saved one shows the lines of its day's code, and goes stale when a line
    it shows gains or loses a field: re-save it with the command its file names."""
    samples = saved_samples()
    kinds = {kind.split()[0] for _, kind, _ in samples}
    assert {"start", "update", "trend", "done", "fault", "bench"} <= kinds, f"samples found only of kinds {kinds}"
    stale = []
    for where, kind, fields in samples:
        allowed = expected.get(kind)
        if not allowed:
            stale.append(f"{where}: the code prints no line of kind {kind!r}")
        elif fields not in allowed:
            nearest = min(allowed, key=lambda a: len(a ^ fields))
            stale.append(f"{where}: {kind} line missing {sorted(nearest - fields)}, extra {sorted(fields - nearest)}")
    assert not stale, "stale saved samples (re-save each with the command its file names):\n" + "\n".join(stale)


# -- figures the docs quote from files the repo keeps (issue 56) ------------------------------------------

NUMBERS = {2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight"}


def test_the_docs_count_the_tests_marked_alone():
    marked = sum(
        len(re.findall(r"^@pytest\.mark\.alone\b", p.read_text(), re.MULTILINE))
        for p in (REPO / "tests").glob("test_*.py")
    )
    text = " ".join((REPO / "docs" / "development.md").read_text().split())
    said = re.findall(r"the (\w+) tests that start or stop nodes \(marked `alone`\)", text)
    assert said == [NUMBERS[marked]], (marked, said)


def test_du_sizes_are_quoted_in_mib_and_gib_as_du_prints_them():
    """`du -sh` prints binary units (750M is 750 MiB): a page quoting a saved sample's du says MiB and GiB."""
    sizes = []
    for sample in ("demo-fresh-clone", "ci-fresh-clone"):
        text = (REPO / "docs" / "samples" / f"{sample}.txt").read_text()
        sizes += re.findall(r"^(\d+(?:\.\d+)?)([MG])\s", text, re.MULTILINE)
    assert len(sizes) == 2, sizes
    pages = " ".join(" ".join(p.read_text().split()) for p in DOCS)
    for number, unit in sizes:
        assert f"{number} {unit}iB" in pages and f"{number} {unit}B" not in pages, (number, unit)


def test_an_untrained_policys_reward_is_the_committed_runs_first_update():
    from pgpong.rundir import RunDir

    firsts = [RunDir(REPO / "job" / "tools" / "runs" / d).metrics()[0]["reward_mean"] for d in BATCH_300]
    text = " ".join((REPO / "docs" / "results.md").read_text().split())
    assert f"first update averaged {firsts[0]:.2f} and {firsts[1]:.2f}" in text, firsts
    pages = " ".join(" ".join(p.read_text().split()) for p in DOCS)
    assert "random policy scores" not in pages


def test_the_spot_shares_are_the_highest_zones_of_the_example_table():
    """docs/aws.md's spot shares of c5.12xlarge and c5.18xlarge: each the highest of the three zones that
    infra/prices.yaml quotes from AWS's example table."""
    rows = dict(
        re.findall(
            r"^#\s+(c5\.\d+xlarge)\s+([\d.]+\s+[\d.]+\s+[\d.]+)",
            (REPO / "infra" / "prices.yaml").read_text(),
            re.MULTILINE,
        )
    )
    [shares] = re.findall(r"^shares = (\{.*\})$", (REPO / "docs" / "aws.md").read_text(), re.MULTILINE)
    for name, (spot, _) in ast.literal_eval(shares).items():
        assert spot == max(float(x) for x in rows[name].split()), (name, spot, rows[name])


def test_the_cluster_errors_sample_shows_each_mistake_exiting_2():
    """A user's mistake exits 2 (pgpong.cli's contract): the saved sample of the job targets' mistakes on a cluster
    shows make's `Error 2` for each, and each of its commands as typed reaches the target (no variable refused)."""
    text = (REPO / "docs" / "samples" / "errors-on-a-cluster.txt").read_text()
    codes = re.findall(r"^make: \*\*\* \[[\w-]+\] Error (\d+)$", text, re.MULTILINE)
    assert len(codes) == text.count("\n$ ") and set(codes) == {"2"}, codes
    assert "no such variable" not in text


if __name__ == "__main__":
    seen = set()
    for line in run_tiny(dict(os.environ, RAY_ADDRESS="local", PYTHONUNBUFFERED="1", **THREADS)):
        parsed = line_kind(line)
        if parsed and parsed[0] not in seen:
            seen.add(parsed[0])
            print(line)
    for fields in fault_field_sets():
        print("fault fields (from pgpong/pool.py): " + " ".join(sorted(fields)))
