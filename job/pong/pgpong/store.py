"""Where a run directory lives: a local folder or an S3 prefix. No Ray here.

Both give the same guarantees: `write` makes an object appear whole or not at all
(a local temp file renamed into place; an S3 PUT, which is visible only once the
upload completed), so a checkpoint counts as the latest only when it is complete.

S3 credentials come from boto3's normal chain (environment, ~/.aws, the instance's
IAM role on AWS); nothing here reads a key from the repo or the job's files.
"""

import os
import tempfile

TMP_SUFFIX = ".tmp"  # a local write goes to .<name>.<random>.tmp, then is renamed into place


class StoreError(Exception):
    """The run directory cannot be used; one line saying why and what to do."""


def split_url(url):
    """(bucket, prefix) of an s3:// run dir; StoreError if it names no bucket."""
    bucket, _, prefix = url[len("s3://") :].partition("/")
    if not bucket:
        raise StoreError(f"run dir {url!r} names no bucket; use s3://BUCKET/PREFIX")
    return bucket, prefix


def open_store(run_dir):
    if run_dir.startswith("s3://"):
        return S3Store(run_dir)
    return LocalStore(run_dir)


def where(run_dir):
    """The run dir as the trainer and the tools name it: an s3:// URL as given, a local folder
    made absolute (~ expanded)."""
    run_dir = str(run_dir)
    return run_dir if run_dir.startswith("s3://") else os.path.abspath(os.path.expanduser(run_dir))


def join(run_dir, name):
    return run_dir.rstrip("/") + "/" + name


class LocalStore:
    appends = True  # append() adds to the end of the file in place

    def __init__(self, root):
        self.root = root

    def prepare(self):
        """Create the folder and check that it takes writes; StoreError if not."""
        if os.path.exists(self.root) and not os.path.isdir(self.root):
            raise StoreError(f"run dir {self.root} is a file, not a folder; give a folder as --run-dir")
        try:
            os.makedirs(self.root, exist_ok=True)
            with tempfile.TemporaryFile(dir=self.root):
                pass
        except OSError as e:
            raise StoreError(f"cannot write run dir {self.root}: {e.strerror or e}") from None

    def clean(self):
        """Remove the temp files of a writer killed before its rename (only the run dir's lock holder may)."""
        try:
            for name in os.listdir(self.root):
                if name.startswith(".") and name.endswith(TMP_SUFFIX):
                    os.unlink(os.path.join(self.root, name))
        except OSError as e:
            raise StoreError(f"cannot write run dir {self.root}: {e.strerror or e}") from None

    def names(self):
        try:
            return os.listdir(self.root)
        except FileNotFoundError:
            return []

    def read(self, name):
        with open(os.path.join(self.root, name), "rb") as f:
            return f.read()

    def write(self, name, data):
        path = os.path.join(self.root, name)
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=TMP_SUFFIX, dir=self.root)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as e:  # disk full, a file size limit, the folder gone
            raise StoreError(f"cannot write {path}: {e.strerror or e}") from None

    def append(self, name, text):
        path = os.path.join(self.root, name)
        try:
            with open(path, "a") as f:
                f.write(text)
        except OSError as e:
            raise StoreError(f"cannot write {path}: {e.strerror or e}") from None

    def delete(self, name):
        path = os.path.join(self.root, name)
        try:
            os.unlink(path)
        except OSError as e:
            raise StoreError(f"cannot delete {path}: {e.strerror or e}") from None


class S3Store:
    """An S3 prefix. S3 has no append: the file appended to last is kept here and PUT whole.

    So callers append to small files (rundir.py writes metrics in segments).
    """

    appends = False

    def __init__(self, url):
        bucket, prefix = split_url(url)
        self.url, self.bucket, self.prefix = url, bucket, prefix.strip("/")
        self.appended = {}
        import boto3

        self.s3 = boto3.session.Session().client("s3")  # a fresh credential lookup, not a cached one

    def key(self, name):
        return f"{self.prefix}/{name}" if self.prefix else name

    def _call(self, what, fn, quiet=(), **kwargs):
        """fn(Bucket=..., **kwargs), its errors as one StoreError line; None for an error code in quiet."""
        from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

        try:
            try:
                return fn(Bucket=self.bucket, **kwargs)
            except ClientError as e:
                if e.response.get("Error", {}).get("Code", "") in quiet:
                    return None
                raise
        except NoCredentialsError:
            raise StoreError(
                f"no AWS credentials to {what} {self.url}; on AWS give the head node an IAM role "
                "(docs/reliability.md, Checkpoints on S3), elsewhere set AWS_PROFILE or AWS_ACCESS_KEY_ID"
            ) from None
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            if code in ("NoSuchBucket", "404") and "Key" not in kwargs:
                raise StoreError(f"S3 bucket {self.bucket!r} does not exist; create it or fix --run-dir") from None
            if code in ("AccessDenied", "403", "AllAccessDisabled"):
                raise StoreError(
                    f"S3 denied access to {self.url} ({what}); "
                    "grant the policy in docs/reliability.md, Checkpoints on S3"
                ) from None
            raise StoreError(f"S3 could not {what} {self.url}: {code or e}") from None
        except BotoCoreError as e:
            raise StoreError(f"S3 could not {what} {self.url}: {e}") from None

    def prepare(self):
        self._call("reach", self.s3.head_bucket)
        probe = self.key(".pong-write-check")
        self._call("write to", self.s3.put_object, Key=probe, Body=b"")
        self._call("write to", self.s3.delete_object, Key=probe)

    def clean(self):
        """Nothing to clean: an S3 PUT leaves no partial object."""

    # Conditional writes (S3's If-None-Match and If-Match), for the run dir's lock (lock.py).
    # A write that lost its condition is answered None: PreconditionFailed (412), or
    # ConditionalRequestConflict (409) when another conditional write to the key runs at once.
    LOST = ("PreconditionFailed", "ConditionalRequestConflict", "NoSuchKey")

    def create(self, name, data):
        """PUT name only if no object has that name: its ETag, or None if one does."""
        done = self._call(
            "write to", self.s3.put_object, quiet=self.LOST, Key=self.key(name), Body=data, IfNoneMatch="*"
        )
        return done and done["ETag"]

    def replace(self, name, data, etag):
        """PUT name only if its ETag is still etag: the new ETag, or None if it changed or is gone."""
        done = self._call("write to", self.s3.put_object, quiet=self.LOST, Key=self.key(name), Body=data, IfMatch=etag)
        return done and done["ETag"]

    def read_tagged(self, name):
        """(bytes, ETag) of name, or None if there is none."""
        got = self._call("read", self.s3.get_object, quiet=("NoSuchKey",), Key=self.key(name))
        return got and (got["Body"].read(), got["ETag"])

    def delete_tagged(self, name, etag):
        """Delete name only if its ETag is still etag."""
        self._call("delete from", self.s3.delete_object, quiet=self.LOST, Key=self.key(name), IfMatch=etag)

    def names(self):
        names, token = [], {}
        start = self.key("")
        while True:
            page = self._call("list", self.s3.list_objects_v2, Prefix=start, **token)
            names += [o["Key"][len(start) :] for o in page.get("Contents", []) if "/" not in o["Key"][len(start) :]]
            if not page.get("IsTruncated"):
                return names
            token = {"ContinuationToken": page["NextContinuationToken"]}

    def read(self, name):
        from botocore.exceptions import ClientError

        try:
            return self.s3.get_object(Bucket=self.bucket, Key=self.key(name))["Body"].read()
        except ClientError as e:
            raise OSError(f"cannot read s3://{self.bucket}/{self.key(name)}: {e}") from None

    def write(self, name, data):
        self._call("write to", self.s3.put_object, Key=self.key(name), Body=data)
        self.appended.pop(name, None)  # the next append reads it again

    def append(self, name, text):
        if name not in self.appended:  # a new file to append to: forget the previous one
            self.appended = {name: self.read(name).decode() if name in self.names() else ""}
        self.appended[name] += text
        self.write(name, self.appended[name].encode())

    def delete(self, name):
        self.appended.pop(name, None)
        self._call("delete from", self.s3.delete_object, Key=self.key(name))
