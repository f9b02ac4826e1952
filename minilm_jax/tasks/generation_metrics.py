"""Text-generation metrics from the libraries the field uses: corpus BLEU-4 (sacrebleu, its default
13a tokenisation), ROUGE-1/2/L F1 (Google's rouge-score, Porter stemming) and METEOR (NLTK, with
WordNet 3.0 for synonyms). All are percentages. Question generation papers (UniLM, MiniLM) report
the METEOR of the original Java METEOR 1.5; NLTK's reimplementation gives close but not identical
values, and tokenises here by words and punctuation, lower-cased.

rouge-score and NLTK are imported where they score: NLTK (which rouge-score imports) imports
scikit-learn and scipy, about a second that every program would otherwise spend at start-up.
"""

import functools
import os
import re
import shutil
import warnings

import numpy as np
import sacrebleu

from minilm_jax.data.wordnet_db import WORDNET_DIR
from minilm_jax.errors import UserError

# WordNet's lexicographer files (lexnames(5WN)); Debian's wordnet-base does not ship this index,
# which NLTK's reader requires.
_LEXNAMES = (
  "adj.all adj.pert adv.all noun.Tops noun.act noun.animal noun.artifact noun.attribute noun.body noun.cognition "
  "noun.communication noun.event noun.feeling noun.food noun.group noun.location noun.motive noun.object noun.person "
  "noun.phenomenon noun.plant noun.possession noun.process noun.quantity noun.relation noun.shape noun.state "
  "noun.substance noun.time verb.body verb.change verb.cognition verb.communication verb.competition "
  "verb.consumption verb.contact verb.creation verb.emotion verb.motion verb.perception verb.possession verb.social "
  "verb.stative verb.weather adj.ppl"
).split()
_POS_NUMBER = {"noun": 1, "verb": 2, "adj": 3, "adv": 4}
_WORDNET_FILES = [f"{kind}.{pos}" for kind in ("data", "index") for pos in ("noun", "verb", "adj", "adv")] + [
  f"{pos}.exc" for pos in ("noun", "verb", "adj", "adv")
]


def bleu4(predictions: list, references: list) -> float:
  return float(sacrebleu.corpus_bleu(predictions, [references]).score)


def rouge(predictions: list, references: list, kinds=("rouge1", "rouge2", "rougeL")) -> dict:
  """Mean F1 of each ROUGE kind over the examples."""
  from rouge_score import rouge_scorer

  scorer = rouge_scorer.RougeScorer(list(kinds), use_stemmer=True)
  scores = [scorer.score(reference, prediction) for prediction, reference in zip(predictions, references)]
  return {k: 100 * float(np.mean([s[k].fmeasure for s in scores])) for k in kinds}


def _words(text: str) -> list:
  return re.findall(r"\w+|[^\w\s]", text.lower())


def meteor(predictions: list, references: list, wordnet_dir: str = "") -> float:
  from nltk.translate.meteor_score import meteor_score

  wordnet = _wordnet(wordnet_dir)
  return 100 * float(
    np.mean([meteor_score([_words(r)], _words(p), wordnet=wordnet) for p, r in zip(predictions, references)])
  )


@functools.cache
def _wordnet(wordnet_dir: str):
  """NLTK's WordNet reader over Debian's WordNet 3.0 files, copied with the index NLTK needs into a
  cache folder (NLTK reads only below its own data paths)."""
  import nltk
  from nltk.corpus.reader.wordnet import WordNetCorpusReader

  class WordNet30(WordNetCorpusReader):
    def map_wn(self, version="wordnet"):
      return None  # these files are WordNet 3.0, NLTK's own: no mapping between versions

  source = wordnet_dir or WORDNET_DIR
  missing = [f for f in _WORDNET_FILES if not os.path.isfile(os.path.join(source, f))]
  if missing:
    raise UserError(
      f"METEOR needs WordNet 3.0, and {source} lacks {missing[:3]}: `apt-get install wordnet-base`, or "
      f"set data_dir to a WordNet dict folder"
    )
  target = os.path.join(os.path.expanduser(os.environ.get("XDG_CACHE_HOME", "~/.cache")), "minilm_jax", "wordnet")
  os.makedirs(target, exist_ok=True)
  for f in _WORDNET_FILES:
    if not os.path.isfile(os.path.join(target, f)):
      shutil.copyfile(os.path.join(source, f), os.path.join(target, f))
  with open(os.path.join(target, "lexnames"), "w") as out:
    out.writelines(f"{i:02d}\t{name}\t{_POS_NUMBER[name.split('.')[0]]}\n" for i, name in enumerate(_LEXNAMES))
  if target not in nltk.data.path:
    nltk.data.path.append(target)

  with warnings.catch_warnings():  # "multilingual functions are not available": not used by METEOR
    warnings.simplefilter("ignore", UserWarning)
    return WordNet30(target, None)


def generation_scores(metrics: tuple, predictions: list, references: list, wordnet_dir: str = "") -> dict:
  scores = {}
  kinds = tuple(m for m in metrics if m.startswith("rouge"))
  if kinds:
    scores.update(rouge(predictions, references, kinds))
  if "bleu4" in metrics:
    scores["bleu4"] = bleu4(predictions, references)
  if "meteor" in metrics:
    scores["meteor"] = meteor(predictions, references, wordnet_dir)
  return {m: scores[m] for m in metrics}
