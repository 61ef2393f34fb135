"""What could leak: the files a submission uploads. (401 without the token: test_submit.py;
no Ray port open to the world: test_cluster_yaml.py; the token absent from job logs: test_e2e.py.)
And what a submission uploads at all: the trainer's package, nothing of the tools. The token `make token`
writes is its owner's alone."""

import ast
import os
import re
import shutil
import sys
import time
import zipfile

import pytest
from harness import JOB_DIR, REPO, clean_env, run
from harness.cluster import stop_job

SECRETS = [
    ".env",
    ".env.local",
    "id_rsa.pem",
    "server.key",
    "cert.p12",
    ".aws/credentials",
    ".ssh/id_ed25519",
    ".netrc",
    "gcp-credentials.json",
    "auth_token",
    "pgpong/__pycache__/train.cpython-311.pyc",
]


def test_the_uploaded_working_dir_leaves_out_anything_that_could_hold_a_secret(tmp_path):
    """Ray's own packaging, which reads the job's .rayignore, on a job folder salted with secrets."""
    from ray._private.runtime_env.packaging import create_package

    job = tmp_path / "job"
    (job / "pkg").mkdir(parents=True)
    (job / "pkg" / "train.py").write_text("print('hi')\n")
    secrets = [s.replace("pgpong/", "pkg/") for s in SECRETS]
    for name in secrets:
        (job / name).parent.mkdir(parents=True, exist_ok=True)
        (job / name).write_text("secret\n")
    shutil.copy(REPO / "job" / "pong" / ".rayignore", job / ".rayignore")
    target = tmp_path / "package.zip"
    create_package(str(job), target, include_gitignore=True)
    with zipfile.ZipFile(target) as z:
        names = {n.rstrip("/") for n in z.namelist()}
    assert "pkg/train.py" in names
    assert not [s for s in secrets if s in names], names


def test_make_token_writes_a_token_only_its_owner_can_read(tmp_path):
    """`make token` under the usual umask 022 (files 0644, folders 0755) in a home without ~/.ray: the token is
    0600 and ~/.ray 0700, made so (no moment when another user could read them); a second call keeps the token."""
    home = tmp_path / "home"
    home.mkdir()
    env = clean_env(HOME=str(home))
    made = run(["bash", "-c", "umask 022 && make token"], env, timeout=120)
    assert made.returncode == 0 and made.stdout.startswith("token: ~/.ray/auth_token"), made.stdout + made.stderr
    token = home / ".ray" / "auth_token"
    assert (oct(token.stat().st_mode & 0o777), oct(token.parent.stat().st_mode & 0o777)) == ("0o600", "0o700")
    first = token.read_text()
    again = run(["bash", "-c", "umask 022 && make token"], env, timeout=120)
    assert again.returncode == 0 and token.read_text() == first, again.stdout + again.stderr


def trainer_files(package="pgpong", entries=("train",)):
    """The files of `package` that `python -m <package>.<entry>` can reach, for each entry: the modules it imports,
    at the top or inside a function, theirs in turn, and the data files they name (learning_rates.json)."""
    folder = JOB_DIR / package
    seen, todo, files = set(), [*entries, "__init__"], set()
    while todo:
        module = todo.pop()
        if module in seen or not (folder / f"{module}.py").exists():
            continue
        seen.add(module)
        files.add(f"{package}/{module}.py")
        for node in ast.walk(ast.parse((folder / f"{module}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level == 1 or node.module == package):
                todo += [node.module] if node.level == 1 and node.module else [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package + "."):
                todo.append(node.module.split(".", 1)[1])
            elif isinstance(node, ast.Constant) and re.fullmatch(r"[\w-]+\.[a-z]+", f"{node.value}"):
                if (folder / node.value).is_file():
                    files.add(f"{package}/{node.value}")
    return files


def head_watcher_modules(package="pgpong"):
    """The modules of `package` that the head's autodown watcher (infra/autodown.py) imports: the job's package
    carries them on purpose, since the head has it (pgpong.raystart, cli, logline)."""
    found = set()
    for node in ast.walk(ast.parse((REPO / "infra" / "autodown.py").read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == package:
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(package + "."):
            found.add(node.module.split(".", 1)[1])
    return sorted(found)


def test_the_job_folder_packages_the_trainer_and_nothing_else(tmp_path):
    """What `ray job submit --working-dir job/pong` uploads, packaged by Ray's own code (which reads the
    job's .rayignore): runtime_env.yaml and the files the trainer or the head's watcher reaches. A tool's module
    or data in job/pong, which neither imports, fails this."""
    from ray._private.runtime_env.packaging import create_package

    target = tmp_path / "package.zip"
    create_package(str(JOB_DIR), target, include_gitignore=True)
    with zipfile.ZipFile(target) as z:
        names = {n for n in z.namelist() if not n.endswith("/")} - {".rayignore"}
    assert "pgpong/train.py" in names and "pgpong/learning_rates.json" in names
    assert "raystart" in head_watcher_modules(), head_watcher_modules()
    wanted = {"runtime_env.yaml", *trainer_files(entries=["train", *head_watcher_modules()])}
    assert names == wanted, sorted(names ^ wanted)


@pytest.mark.slow
def test_a_submission_uploads_the_package_and_nothing_that_could_hold_a_secret(ray_cluster, tmp_path):
    """A copy of the repo's job/ whose pong folder is salted with secrets, submitted as a user does
    (pongtools.submit, the copy's: its packages first on PYTHONPATH) to the test cluster; then the working dir the
    cluster unpacked is read back."""
    copy = tmp_path / "repo"
    shutil.copytree(REPO / "job", copy / "job", ignore=shutil.ignore_patterns("__pycache__", "results"))
    shutil.copytree(REPO / "infra", copy / "infra")
    job = copy / "job" / "pong"
    marker = f"uploaded-{tmp_path.name}.txt"  # an ordinary file, to find this upload on the cluster
    for name in [*SECRETS, marker]:
        (job / name).parent.mkdir(parents=True, exist_ok=True)
        (job / name).write_text("secret\n")
    tools = os.pathsep.join([str(copy / "job" / "pong"), str(copy / "job" / "tools")])
    env = ray_cluster.client_env(LAST_JOB_FILE=str(tmp_path / "last-job"), PYTHONPATH=tools)
    # a run dir the trainer cannot write (which submit cannot check here): the job ends at once, after Ray has
    # unpacked its working dir (arguments its parser refuses, such as --batch-size 0, submit refuses itself)
    args = ["--updates", "1", "--run-dir", "/proc/pong-run"]
    submitted = run([sys.executable, "-m", "pongtools.submit", "pong", "--", *args], env, timeout=120, cwd=copy)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_id = (tmp_path / "last-job").read_text().strip()
    try:
        deadline = time.monotonic() + 120
        while not (found := list(ray_cluster.temp_dir.rglob(marker))):
            assert time.monotonic() < deadline, "the cluster never unpacked the submission"
            time.sleep(1)
    finally:
        stop_job(env, job_id)
    unpacked = found[0].parent
    names = {str(p.relative_to(unpacked)) for p in unpacked.rglob("*")}
    assert "pgpong/train.py" in names, names
    assert not [s for s in SECRETS if s in names], names
