"""The config field reference (docs/config.md), generated from the comments in
`transformer_jax/config.py`: `python -m transformer_jax.config > docs/config.md`."""

import dataclasses
import inspect
import io
import re
import tokenize

from transformer_jax import config


def field_reference() -> str:
  """Every config field with its default and the comment beside it in this file (or
  the comment block just above it), as Markdown: docs/config.md is this text."""
  out = ["# Config fields", "",
         "Every field of `config.<section>.<field>`, with its default (the paper's base",
         "model where the paper says) and its meaning. Generated from",
         "`transformer_jax/config.py` by `python -m transformer_jax.config`; configs in",
         "`configs/` change some defaults, and `main --print_config` shows a resolved one.",
         "A run resumed with a changed field goes on only where `resume` says yes; any",
         "other change would not match its checkpoints, and the run refuses to start."]
  for section, cls in ((f.name, type(f.default)) for f in dataclasses.fields(config.Config)):
    source = inspect.getsource(cls)
    comments: dict[int, str] = {}  # Line number -> comment text.
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
      if token.type == tokenize.COMMENT:
        comments[token.start[0]] = token.string.lstrip("# ").strip()
    lines = source.splitlines()
    out += ["", f"## `{section}`", "", "| field | default | resume | meaning |",
            "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
      if section == "model" and f.name == "vocab_size":
        continue  # Filled in from the tokenizer, not a config field.
      row = next(i for i, line in enumerate(lines, 1)  # Its annotated assignment.
                 if re.match(rf"\s*{f.name}: [^=]+ = ", line))
      meaning = comments.get(row, "")
      if not meaning:  # The comment block just above, if any.
        above = []
        while row - 1 in comments and lines[row - 2].strip().startswith("#"):
          row -= 1
          above.insert(0, comments[row])
        meaning = " ".join(above)
      default = repr(f.default)
      default = f"`{default}`" if len(default) <= 40 else "(long: see config.py)"
      resume = "yes" if f.metadata.get("resumable") else ""
      out.append(f"| `{f.name}` | {default} | {resume} | {meaning.replace('|', '/')} |")
  return "\n".join(out) + "\n"
