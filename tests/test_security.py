"""What could leak: the files a submission uploads. (401 without the token: test_submit.py;
no Ray port open to the world: test_cluster_yaml.py; the token absent from job logs: test_e2e.py.)"""

import shutil
import zipfile

from conftest import REPO


def test_the_uploaded_working_dir_leaves_out_anything_that_could_hold_a_secret(tmp_path):
    """Ray's own packaging, which reads the job's .rayignore, on a job folder salted with secrets."""
    from ray._private.runtime_env.packaging import create_package

    job = tmp_path / "job"
    (job / "pkg").mkdir(parents=True)
    (job / "pkg" / "train.py").write_text("print('hi')\n")
    secrets = [".env", ".env.local", "id_rsa.pem", "server.key", "cert.p12", ".aws/credentials", ".ssh/id_ed25519",
               ".netrc", "gcp-credentials.json", "auth_token", "pkg/__pycache__/train.cpython-311.pyc"]  # fmt: skip
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
