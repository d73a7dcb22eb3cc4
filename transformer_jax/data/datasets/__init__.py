"""The datasets `data.task` names, one module each, named as the task: each registers
its Corpus (data/corpora.py) with `DATASETS` (config/sections.py) when a config names
it, so a new dataset is one new module here (docs/extending.md). A module that needs
TensorFlow imports it only when it reads (tfds, multi30k/builder.py).

  numbers    English -> German number words, generated (no download)
  text       your parallel text files (data.train_files, eval_files, test_files)
  tfds       any TFDS translation dataset (data.tfds_name; WMT14 by default)
  multi30k   Multi30k task 1, from its plain files or through its TFDS builder
"""
