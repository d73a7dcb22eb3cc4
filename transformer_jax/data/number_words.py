"""The embedded default task: lists of English number words to German.

"thirty-four, one hundred one and seven" -> "vierunddreißig, einhunderteins und sieben".
German puts units before tens and writes each number as one word, so the model must
reorder, merge and inflect ("eins" / "ein"), not copy. Each example lists 1 to 3
numbers from 0..999,999, drawn with a uniform number of digits. Held-out examples use
only held-out numbers (3 to 6 digits), which never occur in training. Needs no download.
"""

from __future__ import annotations

import numpy as np

_EN_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
            "fourteen fifteen sixteen seventeen eighteen nineteen").split()
_EN_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_DE_ONES = ("null eins zwei drei vier fünf sechs sieben acht neun zehn elf zwölf dreizehn "
            "vierzehn fünfzehn sechzehn siebzehn achtzehn neunzehn").split()
_DE_TENS = "_ _ zwanzig dreißig vierzig fünfzig sechzig siebzig achtzig neunzig".split()
MAX_NUMBER = 999_999


def english(n: int) -> str:
  """American English number words: 1234 -> 'one thousand two hundred thirty-four'."""
  def below_100(m):
    if m < 20:
      return _EN_ONES[m]
    return _EN_TENS[m // 10] + (f"-{_EN_ONES[m % 10]}" if m % 10 else "")

  def below_1000(m):
    words = [f"{_EN_ONES[m // 100]} hundred"] if m >= 100 else []
    return " ".join(words + ([below_100(m % 100)] if m % 100 else []))

  if not 0 <= n <= MAX_NUMBER:
    raise ValueError(f"number {n} outside 0..{MAX_NUMBER}")
  if n == 0:
    return "zero"
  words = [f"{below_1000(n // 1000)} thousand"] if n >= 1000 else []
  return " ".join(words + ([below_1000(n % 1000)] if n % 1000 else []))


def german(n: int) -> str:
  """German number word: 1234 -> 'eintausendzweihundertvierunddreißig'."""
  def below_100(m, final):
    if m == 1:
      return "eins" if final else "ein"  # "einundzwanzig", "eintausend", but "...eins".
    if m < 20:
      return _DE_ONES[m]
    unit = m % 10
    return (("ein" if unit == 1 else _DE_ONES[unit]) + "und" if unit else "") + \
        _DE_TENS[m // 10]

  def below_1000(m, final):
    hundreds = (below_100(m // 100, final=False) + "hundert") if m >= 100 else ""
    return hundreds + (below_100(m % 100, final) if m % 100 else "")

  if not 0 <= n <= MAX_NUMBER:
    raise ValueError(f"number {n} outside 0..{MAX_NUMBER}")
  if n == 0:
    return "null"
  thousands = (below_1000(n // 1000, final=False) + "tausend") if n >= 1000 else ""
  return thousands + (below_1000(n % 1000, final=True) if n % 1000 else "")


def _draw(rng: np.random.Generator, count: int, min_digits: int) -> np.ndarray:
  digits = rng.integers(min_digits, 7, size=count)
  low = np.where(digits == 1, 0, 10 ** (digits - 1))
  return rng.integers(low, 10**digits)


def held_out_numbers(count: int, seed: int = 1234) -> np.ndarray:
  """`count` distinct numbers of 3 to 6 digits, reserved for evaluation."""
  rng = np.random.default_rng(seed)
  chosen: dict[int, None] = {}
  while len(chosen) < count:
    chosen.update(dict.fromkeys(_draw(rng, count, min_digits=3).tolist()))
  return np.array(list(chosen)[:count])


def _as_list(words: list[str], conjunction: str) -> str:
  """['a'] -> 'a'; ['a', 'b', 'c'] -> 'a, b <conjunction> c'."""
  if len(words) == 1:
    return words[0]
  return f"{', '.join(words[:-1])} {conjunction} {words[-1]}"


def make_split(split: str, count: int, num_held_out: int,
               seed: int = 0) -> tuple[list[str], list[str]]:
  """`count` (english, german) pairs; 'test' uses only the `num_held_out` numbers."""
  held_out = held_out_numbers(num_held_out)
  rng = np.random.default_rng([seed, split == "test"])
  if split == "test":
    pool = held_out
  elif split == "train":
    pool = _draw(rng, max(4 * count, 100_000), min_digits=1)
    pool = pool[~np.isin(pool, held_out)]
  else:
    raise ValueError(f"split={split!r}: expected 'train' or 'test'.")
  sizes = rng.integers(1, 4, size=count)
  english_out, german_out = [], []
  for size in sizes:
    chosen = [int(n) for n in rng.choice(pool, size)]
    english_out.append(_as_list([english(n) for n in chosen], "and"))
    german_out.append(_as_list([german(n) for n in chosen], "und"))
  return english_out, german_out
