"""The VADER sentiment tasks: read from vaderSentiment's source package (nested archives) or a folder,
labelled by the sign of the raters' mean with the neutral band left out, split by document, and
one-line errors for missing or damaged data."""

import io
import os
import tarfile

import numpy as np
import pytest

from conftest import VADER_EXCERPT as EXCERPT
from minilm_jax.errors import UserError
from minilm_jax.tasks import get_task, vader

FILES = os.path.join(EXCERPT, "hutto_ICWSM_2014")


def _expected(path: str) -> dict:
  """The file read with numpy: sentence -> label, every sentence outside the neutral band."""
  ids, ratings, texts = np.loadtxt(path, dtype=str, delimiter="\t", comments=None, encoding="utf-8").T
  ratings = ratings.astype(float)
  keep = np.abs(ratings) >= 0.5
  return dict(zip(texts[keep], (ratings[keep] > 0).astype(int)))


def _sdist(tmp_path) -> str:
  """An archive laid out as vaderSentiment-3.3.2.tar.gz: the paper's data in an archive inside it."""
  inner = io.BytesIO()
  with tarfile.open(fileobj=inner, mode="w:gz") as t:
    t.add(FILES, arcname="hutto_ICWSM_2014")
  path = tmp_path / "vaderSentiment-3.3.2.tar.gz"
  with tarfile.open(path, "w:gz") as t:
    info = tarfile.TarInfo("vaderSentiment-3.3.2/additional_resources/hutto_ICWSM_2014.tar.gz")
    info.size = len(inner.getvalue())
    t.addfile(info, io.BytesIO(inner.getvalue()))
  return str(path)


@pytest.mark.parametrize("task", ["vader_movies", "vader_tweets"])
def test_labels_are_the_sign_of_the_mean_rating_and_the_splits_partition_the_file(task, tmp_path):
  source = {"vader_movies": "movieReviewSnippets", "vader_tweets": "tweets"}[task]
  expected = _expected(os.path.join(FILES, f"{source}_GroundTruth.txt"))
  for data_dir in (EXCERPT, FILES, _sdist(tmp_path)):
    splits = {split: get_task(task).load(split, data_dir) for split in ("train", "dev")}
    seen = {}
    for split in splits.values():
      assert split.column_names == ["text_a", "text_b", "label", "idx", "group"]
      seen.update(zip(split["text_a"], split["label"]))
    assert seen == expected  # every rated sentence once, in one split, with its sign
    assert not set(splits["train"]["text_a"]) & set(splits["dev"]["text_a"])
    assert all(set(split["label"]) == {0, 1} for split in splits.values())  # both classes in each split
    assert 0.1 < len(splits["dev"]) / len(expected) < 0.35


def test_the_rating_task_scores_every_snippet_by_its_raters_mean(tmp_path):
  """`vader_movies_rating`: every movie snippet, the neutral ones too, labelled by its raters' mean
  (numpy's reading of the file), in the classification task's document splits; Pearson and Spearman."""
  ids, ratings, texts = np.loadtxt(
    os.path.join(FILES, "movieReviewSnippets_GroundTruth.txt"),
    dtype=str,
    delimiter="\t",
    comments=None,
    encoding="utf-8",
  ).T
  task = get_task("vader_movies_rating")
  assert task.labels is None and task.metrics == ("pearson", "spearman") and task.head()["num_labels"] == 1
  for data_dir in (EXCERPT, _sdist(tmp_path)):
    splits = {split: task.load(split, data_dir) for split in ("train", "dev")}
    seen = sorted((text, label) for split in splits.values() for text, label in zip(split["text_a"], split["label"]))
    assert seen == sorted(zip(texts, ratings.astype(float)))  # every snippet once, with its mean rating
    assert any(abs(label) < vader.NEUTRAL_BAND for _, label in seen)
    # The same document splits as the sentiment task: its dev sentences are the rating task's dev
    # sentences outside the neutral band.
    classified = set(get_task("vader_movies").load("dev", data_dir)["text_a"])
    assert classified == {t for t, label in zip(splits["dev"]["text_a"], splits["dev"]["label"]) if abs(label) >= 0.5}


def test_a_documents_sentences_stay_in_one_split():
  """Amazon's ids are review_sentence: a review's sentences are never split between train and dev."""
  task = get_task("vader_amazon")
  reviews = {}
  lines = open(os.path.join(FILES, "amazonReviewSnippets_GroundTruth.txt"), encoding="utf-8").read().splitlines()
  for split in ("train", "dev"):
    for number in task.load(split, EXCERPT)["idx"]:
      reviews.setdefault(lines[number - 1].split("_")[0], set()).add(split)
  assert len(reviews) > 5 and all(len(splits) == 1 for splits in reviews.values())


def test_missing_or_damaged_data_is_one_line_naming_it_and_how_to_get_it(tmp_path):
  how = "pip download vaderSentiment==3.3.2"
  task = get_task("vader_movies")
  with pytest.raises(UserError, match=f"read vaderSentiment's source package: `{how}"):
    task.load("train", "")
  with pytest.raises(UserError, match=f"{tmp_path} holds no movieReviewSnippets_GroundTruth.txt: `{how}"):
    task.load("train", str(tmp_path))
  (tmp_path / "cut.tar.gz").write_bytes(open(_sdist(tmp_path), "rb").read()[:200])
  with pytest.raises(UserError, match="cut.tar.gz is not a readable .tar.gz"):
    task.load("train", str(tmp_path / "cut.tar.gz"))
  bad = tmp_path / "bad"
  bad.mkdir()
  (bad / "movieReviewSnippets_GroundTruth.txt").write_text("1\t2.0\tfine\n2\tgreat\n", encoding="utf-8")
  with pytest.raises(UserError, match=r"movieReviewSnippets_GroundTruth.txt:2 in .* is not 'id<TAB>mean rating"):
    task.load("train", str(bad))
  with pytest.raises(UserError, match="vader_movies has the splits \\['dev', 'train'\\], not 'test'"):
    task.load("test", EXCERPT)
  assert vader.NEUTRAL_BAND == 0.5
