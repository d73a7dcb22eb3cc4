"""data.task="tfds": any TFDS translation dataset (data.tfds_name, e.g. WMT14's
wmt14_translate/de-en), prepared and read by TFDS with TensorFlow, in either direction;
its test split, or data.test_files (the test set from elsewhere, e.g. newstest2014 from
sacreBLEU). TensorFlow is imported only when a dataset is checked, prepared or read."""

from __future__ import annotations

from typing import Iterable, Iterator

from transformer_jax import stop_policy
from transformer_jax.config import DATASETS, DataConfig, InputError, NotPrepared
from transformer_jax.data import corpora
from transformer_jax.data.corpora import Corpus


def tensorflow_datasets(task: str):
  """tensorflow_datasets, which prepares and reads its datasets with TensorFlow: both are
  imported only here, by the TFDS datasets, or named in a one-line error."""
  try:
    with stop_policy.stops_held():
      import tensorflow  # noqa: F401
      import tensorflow_datasets as tfds
  except ImportError as e:
    raise InputError(f"config.data.task={task!r} reads a TFDS dataset, which needs "
                     f"TensorFlow and tensorflow-datasets ({e}): pip install "
                     "'transformer-jax[tfds]' (in a clone: pip install -e '.[tfds]').") from e
  return tfds


@DATASETS.register("tfds")
class TfdsDataset(Corpus):
  """The TFDS dataset data.tfds_name (NAME/CONFIG:VERSION), or one of this project's
  with its own TFDS builder (a subclass, e.g. multi30k)."""

  reads_files = ("test",)

  @classmethod
  def of(cls, cfg: DataConfig) -> Corpus:
    """data.tfds_name may name a dataset of this package that has its own TFDS builder
    (multi30k): read through that builder."""
    own = (DATASETS.get(cfg.tfds_name, "config.data.tfds_name")
           if cfg.tfds_name in DATASETS.names() else cls)
    return own(cfg) if issubclass(own, TfdsDataset) else cls(cfg)

  @classmethod
  def reads_tfds(cls, cfg: DataConfig) -> bool:
    return True

  @classmethod
  def named(cls, cfg: DataConfig) -> str:
    return cfg.tfds_name

  @property
  def name(self) -> str:
    """The dataset's name for TFDS (with its version, if pinned)."""
    return self.cfg.tfds_name

  def tfds_builder(self):
    """TFDS's builder of the dataset (nothing downloaded)."""
    tfds = tensorflow_datasets(self.cfg.task)
    try:
      return tfds.builder(self.name, data_dir=self.cfg.tfds_data_dir or None)
    except Exception as e:  # TFDS names the unknown dataset or config and close matches.
      raise InputError(f"config.data.tfds_name={self.name!r}: "
                       f"{str(e).splitlines()[0]}") from e

  def builder(self):
    """`tfds_builder`, checked to have both languages."""
    builder = self.tfds_builder()
    languages = set(builder.info.features.keys())
    for lang in (self.cfg.source_lang, self.cfg.target_lang):
      if lang not in languages:
        raise InputError(f"data.source_lang/target_lang: {self.name} has languages "
                         f"{sorted(languages)}, not {lang!r}.")
    return builder

  def prepared_builder(self, build: bool = True):
    """(the builder, whether its dataset was built now): one prepared before is read;
    else it is downloaded and built here, into data.tfds_data_dir, when `build` says
    so, and is NotPrepared when not."""
    builder = self.builder()
    if builder.is_prepared():
      return builder, False
    if not build:
      raise NotPrepared(f"the TFDS dataset {self.name} is not prepared in "
                        f"{builder.data_dir} (config.data.tfds_data_dir="
                        f"{self.cfg.tfds_data_dir!r})")
    tfds = tensorflow_datasets(self.cfg.task)
    download_config = tfds.download.DownloadConfig(manual_dir=self.cfg.manual_dir or None)
    builder.download_and_prepare(download_config=download_config)
    return builder, True

  def check_available(self) -> None:
    """TFDS is installed, the dataset exists and has both languages, and data.test_files,
    if given, can be read."""
    self.builder()
    if self.cfg.test_files:
      corpora.check_files(self.cfg, "test")

  def prepare(self, build: bool) -> tuple[bool, str]:
    builder, built = self.prepared_builder(build)
    return built, f"the TFDS dataset {self.name} in {builder.data_dir}"

  def identity(self) -> dict:
    """The TFDS dataset, its version, split and languages."""
    return {"task": "tfds", "name": self.name.split(":")[0],  # The version follows.
            "version": str(self.builder().info.version),
            "split": self.cfg.train_split,
            "languages": [self.cfg.source_lang, self.cfg.target_lang]}

  def pairs(self, split: str) -> Iterable[tuple[str, str]]:
    if split == "test" and self.cfg.test_files:
      return corpora.iter_parallel_files(*corpora.file_pair(self.cfg, "test"))
    return self._examples({"train": self.cfg.train_split, "eval": self.cfg.eval_split,
                           "test": self.cfg.test_split}[split])

  def _examples(self, tfds_split: str) -> Iterator[tuple[str, str]]:
    tfds = tensorflow_datasets(self.cfg.task)
    builder, _ = self.prepared_builder()
    for example in tfds.as_numpy(builder.as_dataset(split=tfds_split)):
      yield (example[self.cfg.source_lang].decode("utf-8"),
             example[self.cfg.target_lang].decode("utf-8"))

  def test_set(self) -> str | None:
    """data.test_files' name where they replace the split, else the test sets the
    builder says its test split is made of (a WMT builder's `subsets`: WMT14's "test" is
    newstest2014), else NAME:SPLIT."""
    if self.cfg.test_files:
      return corpora.named_test_files(self.cfg)
    if not (split := self.cfg.test_split):
      return None
    return self.split_name(split)

  def split_name(self, split: str) -> str:
    """What TFDS's `split` of the dataset is, as the paper's tables name it."""
    subsets = getattr(self.builder(), "subsets", {}).get(split)
    return "+".join(subsets) if subsets else f"{self.name}:{split}"

  def no_test_set(self) -> str:
    return "config.data.test_split is empty: the data has no test split"
