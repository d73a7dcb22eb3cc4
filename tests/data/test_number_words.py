"""The embedded default task: German number words (transformer_jax/data/number_words.py)."""

from transformer_jax.data import number_words


def test_german_number_words():
  assert number_words.german(34) == "vierunddreißig"
  assert number_words.german(1) == "eins" and number_words.german(21) == "einundzwanzig"
  assert number_words.german(101001) == "einhunderteintausendeins"
  assert number_words.german(17) == "siebzehn" and number_words.german(60) == "sechzig"
  assert number_words.english(34) == "thirty-four"
  assert number_words.english(101001) == "one hundred one thousand one"


def test_held_out_numbers_never_appear_in_training():
  held_out = {number_words.german(int(n)) for n in number_words.held_out_numbers(200)}
  _, train_de = number_words.make_split("train", 5000, 200)
  seen = {word for line in train_de for word in line.replace(",", "").split()}
  assert not held_out & seen
  test_en, test_de = number_words.make_split("test", 50, 200)
  assert all(w in held_out for line in test_de for w in line.replace(",", "").split()
             if w != "und")
