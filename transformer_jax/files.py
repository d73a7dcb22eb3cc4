"""Files of a run on any filesystem `etils.epath` reaches: local paths, and gs:// (also
s3://, az://) through tf.io.gfile where TensorFlow is installed, else through fsspec
(gcsfs, s3fs, adlfs). Everything the project reads and writes itself goes through
`epath.Path`, TensorBoard events included (`summaries.py`); checkpoints go through
Orbax, which takes the same paths. Never `os.path` on a workdir: it turns
gs://bucket/run into the local directory ./gs:/bucket/run.
"""

from __future__ import annotations

import contextlib
import errno
import http.client
import importlib.util
import os
import shutil
import tempfile
import urllib.request
import uuid

from etils import epath

from transformer_jax import stop_policy


def is_remote(path: epath.PathLike) -> bool:
  """True for a URI (gs://..., s3://...), False for a local path."""
  return "://" in os.fspath(path)


_FSSPEC_PACKAGE = {"gs": "gcsfs", "s3": "s3fs", "az": "adlfs"}


def missing_filesystem(path: epath.PathLike) -> str | None:
  """Why a URI cannot be reached here (no package for its filesystem), with what to
  install; None for a local path or a URI whose filesystem is installed. Asks no
  network: whether the bucket is there is for whatever uses the path to say."""
  if not is_remote(path):
    return None
  scheme = os.fspath(path).split("://")[0]
  try:
    if importlib.util.find_spec("tensorflow") is not None:
      return None  # epath goes through tf.io.gfile.
  except ValueError:  # Imported as None: blocked, as if not installed.
    pass
  try:
    import fsspec
    fsspec.get_filesystem_class(scheme)
  except (ImportError, ValueError) as e:
    package = _FSSPEC_PACKAGE.get(scheme, "fsspec")
    extra = " (pip install -e '.[tpu]' brings it)" if scheme == "gs" else ""
    return (f"no filesystem for {scheme}:// is installed ({e}): pip install "
            f"{package}{extra}, or tensorflow-cpu for tf.io.gfile.")
  return None


# Where a Google Cloud VM (Compute Engine, a TPU VM) names its maker, as google-auth's
# detect_gce_residency_linux reads it; and its metadata server's address.
DMI_PRODUCT_NAME = "/sys/class/dmi/id/product_name"
METADATA_IP = "169.254.169.254"


def missing_credentials(path: epath.PathLike) -> str | None:
  """Why gs:// `path` would be refused here for want of credentials, in one line saying
  how to get them; None for another path or where credentials are found. Python's gs://
  access (tf.io.gfile, or gcsfs through google-auth) finds application-default
  credentials as google.auth.default does: the key file GOOGLE_APPLICATION_CREDENTIALS
  names, gcloud's file ($CLOUDSDK_CONFIG, else ~/.config/gcloud, then
  application_default_credentials.json), else a Google Cloud VM's metadata server (a
  TPU VM's own service account; NO_GCE_CHECK=true rules it out, as in both). `gcloud
  auth login` alone gives none of them."""
  if not os.fspath(path).startswith("gs://"):
    return None
  key = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
  if key:
    return None if os.path.isfile(key) else (
        f"GOOGLE_APPLICATION_CREDENTIALS={key} is not a file: give a service account's "
        "key file, or unset it and run `gcloud auth application-default login`.")
  config = os.environ.get("CLOUDSDK_CONFIG") or os.path.expanduser("~/.config/gcloud")
  if os.path.isfile(os.path.join(config, "application_default_credentials.json")):
    return None
  if os.environ.get("NO_GCE_CHECK", "").lower() != "true" and _on_google_cloud():
    return None
  return ("no application-default credentials for Python's gs:// access here: run "
          "`gcloud auth application-default login` (or set GOOGLE_APPLICATION_CREDENTIALS "
          "to a service account's key file), then run again.")


def _on_google_cloud() -> bool:
  """A Google Cloud VM, by its DMI product name or else by its metadata server's answer
  (one try, 2 s at most, past any proxy): asked only where no credentials file is."""
  try:
    with open(DMI_PRODUCT_NAME, encoding="utf-8") as f:
      if f.read().startswith("Google"):
        return True
  except OSError:
    pass
  host = os.environ.get("GCE_METADATA_IP", METADATA_IP)
  request = urllib.request.Request(f"http://{host}", headers={"Metadata-Flavor": "Google"})
  try:
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
        request, timeout=2) as response:
      return response.headers.get("Metadata-Flavor") == "Google"
  except (OSError, http.client.HTTPException):  # Nothing there, or not a server of HTTP.
    return False


def writable(directory: epath.PathLike) -> bool:
  """Whether files can be created in `directory` (tried, not guessed from permissions:
  a read-only mount refuses root too). A remote one is taken to be writable."""
  if is_remote(directory):
    return True
  try:
    with tempfile.TemporaryFile(dir=os.fspath(directory)):
      return True
  except OSError:
    return False


def write_atomic(path: epath.PathLike, content: str | bytes) -> None:
  """Writes a temporary file and renames it over `path`: a reader (or a crash) sees the
  old file or the whole new one, never half of it. The temporary name is this write's
  own, so writers at once never share one (the last rename wins); a failed write
  leaves no temporary file."""
  path = epath.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
  try:
    with naming(path):
      if isinstance(content, bytes):
        tmp.write_bytes(content)
      else:
        tmp.write_text(content)
    tmp.replace(path)
  finally:
    if tmp.exists():
      tmp.unlink()


def append_line(path: epath.PathLike, line: str) -> None:
  """Appends one whole line. Locally one write() to a file opened for appending: the
  system places each at the end whole, so processes appending at once lose no line.
  Object stores cannot append: there the file is rewritten whole (write_atomic), and
  appenders at once may lose lines."""
  path = epath.Path(path)
  data = (line.rstrip("\n") + "\n").encode()
  if is_remote(path):
    old = path.read_bytes() if path.exists() else b""
    write_atomic(path, old + data)
    return
  path.parent.mkdir(parents=True, exist_ok=True)
  with naming(path):
    fd = os.open(os.fspath(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
      if os.write(fd, data) != len(data):  # A full disk mid-line: an error, not success.
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    finally:
      os.close(fd)


def umask() -> int:
  """This process's umask (read without changing it for long)."""
  mask = os.umask(0)
  os.umask(mask)
  return mask


def staging_dir(target: epath.PathLike) -> epath.Path:
  """A new empty folder beside `target` (one filesystem: `replace_dir` then renames it
  into place at once), with the permissions a plain mkdir would give."""
  target = epath.Path(target)
  target.parent.mkdir(parents=True, exist_ok=True)
  path = tempfile.mkdtemp(prefix=f".{target.name}.", dir=os.fspath(target.parent))
  os.chmod(path, 0o777 & ~umask())
  return epath.Path(path)


def put_in_place(tmp: epath.PathLike, path: epath.PathLike) -> None:
  """Renames the finished file `tmp` to `path` (one rename: a reader sees the old file
  or the new one), as a command's final output."""
  stop_policy.outputs_begin()
  epath.Path(tmp).replace(path)


def replace_dir(staging: epath.PathLike, target: epath.PathLike) -> None:
  """Puts the whole folder `staging` at `target`; a folder already there is replaced
  only now, so a reader (or a crash) sees the old folder or the new one."""
  stop_policy.outputs_begin()
  target = epath.Path(target)
  if target.exists():
    old = staging_dir(target)
    os.replace(target, old / target.name)
    os.replace(staging, target)
    shutil.rmtree(old)
  else:
    os.replace(staging, target)


@contextlib.contextmanager
def naming(path: epath.PathLike):
  """An OSError raised inside that names no file names `path` (a write to an open file
  does not say which): a full disk's one line then says where."""
  try:
    yield
  except OSError as e:
    if e.filename is not None or e.errno is None:
      raise
    raise OSError(e.errno, e.strerror, os.fspath(path)) from e


def out_of_space(error: BaseException) -> bool:
  """True for a full disk or a bucket over quota, as Python or TensorStore report it."""
  return (isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)
          or any(s in str(error) for s in ("No space left on device", "os_error_code='28'",
                                           "Disk quota exceeded")))
