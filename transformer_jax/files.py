"""Files of a run on any filesystem `etils.epath` reaches: local paths, and gs:// (also
s3://, az://) through tf.io.gfile. Everything the project reads and writes itself goes
through `epath.Path`; checkpoints go through Orbax and TensorBoard events through
tf.summary, which take the same paths. Never `os.path` on a workdir: it turns
gs://bucket/run into the local directory ./gs:/bucket/run.
"""

from __future__ import annotations

import os

from etils import epath


def is_remote(path: epath.PathLike) -> bool:
  """True for a URI (gs://..., s3://...), False for a local path."""
  return "://" in os.fspath(path)


def write_atomic(path: epath.PathLike, text: str) -> None:
  """Writes a temporary file and renames it over `path`: a reader (or a crash) sees the
  old file or the whole new one, never half of it."""
  path = epath.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text(text)
  tmp.replace(path)


def append_line(path: epath.PathLike, line: str) -> None:
  """Appends one line; rewrites the file whole, as object stores cannot append."""
  path = epath.Path(path)
  old = path.read_text() if path.exists() else ""
  write_atomic(path, old + line + "\n")
