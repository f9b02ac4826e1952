"""Sentence-embedding evaluation: one protocol for our runs and for any Hugging Face or
sentence-transformers directory, so that a teacher, its students and the baselines are measured
by one command (`python -m minilm_jax.evaluate --embeddings a,b,c --out DIR`).

- Retrieval on WordNet (offline, real): every dev synset (`wordnet`'s split by synset) that has
  example sentences gives a query, its definition; the documents are the example sentences of all
  those synsets, and a query's relevant documents are its own synset's examples. The word being
  defined is never in its definition, so a model must match meaning, not spelling. Scores:
  recall@1 and recall@10 (the share of a query's relevant documents ranked in the first k,
  averaged over queries) and MRR@10, by cosine similarity.
- STS on an STS-B-format TSV (GLUE's `sentence1`, `sentence2`, `score`): Spearman's rank
  correlation of the cosine similarity with the gold score (scipy).
- `unrelated_cosine`: the mean cosine similarity between the definitions of different synsets;
  near 1 for a collapsed embedding space where everything looks alike.
"""

import dataclasses
import json
import os
from typing import cast

import datasets
import jax
import numpy as np

from minilm_jax import runs
from minilm_jax.data import wordnet_db
from minilm_jax.devices import parallel
from minilm_jax.errors import UserError
from minilm_jax.evaluation.predictor import Predictor
from minilm_jax.models import embeddings
from minilm_jax.models.encoder import Encoder, EncoderOutput
from minilm_jax.tasks import glue, metrics


@dataclasses.dataclass(frozen=True)
class RetrievalSet:
  queries: list
  documents: list
  relevant: list  # per query, the indices of its relevant documents


def wordnet_retrieval(data_dir: str = "", split: str = "dev") -> RetrievalSet:
  """Definitions -> example sentences of the `split` synsets (see the module's docstring)."""
  synsets = [s for s in wordnet_db.read_synsets(data_dir) if s.examples and wordnet_db.split_of(s.offset) == split]
  queries, documents, relevant = list[str](), list[str](), list[list[int]]()
  for s in synsets:
    queries.append(s.definition)
    relevant.append(list(range(len(documents), len(documents) + len(s.examples))))
    documents.extend(s.examples)
  return RetrievalSet(queries, documents, relevant)


def read_retrieval_pairs(path: str, what: str) -> RetrievalSet:
  """A user's retrieval set: a UTF-8 TSV of `query<TAB>relevant document` lines (a query on several
  lines has several relevant documents); the documents are every line's second field."""
  try:
    with open(path, encoding="utf-8") as f:
      lines = [line.rstrip("\n") for line in f if line.strip()]
  except FileNotFoundError:
    raise UserError(f"{what}={path!r} does not exist: give a TSV of query<TAB>relevant document lines") from None
  except UnicodeDecodeError as e:
    raise UserError(f"{what}={path!r} is not UTF-8 text (byte {e.start}): save it as UTF-8") from None
  queries, documents, relevant = dict[str, int](), dict[str, int](), list[list[int]]()
  for number, line in enumerate(lines, start=1):
    fields = line.split("\t")
    if len(fields) != 2 or not all(f.strip() for f in fields):
      raise UserError(f"{path}:{number}: expected query<TAB>relevant document, got {line[:60]!r}")
    query, document = fields
    if query not in queries:
      queries[query] = len(queries)
      relevant.append([])
    documents.setdefault(document, len(documents))
    relevant[queries[query]].append(documents[document])
  return RetrievalSet(list(queries), list(documents), relevant)


def retrieval_scores(query_NxD, document_MxD, relevant) -> dict:
  """recall@1, recall@10 and MRR@10 of cosine-similarity ranking."""
  sims = _unit(query_NxD) @ _unit(document_MxD).T
  top = np.argsort(-sims, axis=1, kind="stable")[:, :10]
  recall: dict[int, list] = {k: [] for k in (1, 10)}
  reciprocal = []
  for ranked, gold in zip(top, relevant):
    hits = np.isin(ranked, gold)
    for k in recall:
      recall[k].append(hits[:k].sum() / len(gold))
    reciprocal.append(1.0 / (np.argmax(hits) + 1) if hits.any() else 0.0)
  return {
    "recall@1": float(np.mean(recall[1])),
    "recall@10": float(np.mean(recall[10])),
    "mrr@10": float(np.mean(reciprocal)),
  }


def unrelated_cosine(embeddings_NxD) -> float:
  """Mean cosine similarity over all pairs of different rows."""
  unit = _unit(embeddings_NxD)
  sims = unit @ unit.T
  n = len(unit)
  return float((sims.sum() - np.trace(sims)) / (n * (n - 1)))


def sts_spearman(a_NxD, b_NxD, gold) -> float:
  cosine = np.sum(_unit(a_NxD) * _unit(b_NxD), axis=-1)
  return metrics.spearman(cosine, gold)


def _unit(x):
  x = np.asarray(x, np.float64)
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


class SentenceEncoder:
  """Sentence embeddings of texts at one length and batch (one compiled shape), computed as
  sentence-transformers computes them (`embeddings.sentence_embeddings`). Its parameters are a
  model's own, {"encoder", "dense"} (`load`, `use`), or, with `learnt`, a distillation student's
  train-state parameters: the encoder's, and the map to the teacher's width that the embedding
  objective learns (passed at each call, as they change)."""

  def __init__(self, model: Encoder, pooling, tokenizer, mesh, batch_size: int, length: int, learnt: bool = False):
    self.tokenizer, self.length, self.mesh, self.params = tokenizer, length, mesh, None
    self.pooling = pooling = dataclasses.replace(pooling, max_seq_length=length)

    def forward(params, batch):
      if learnt:
        encoder, dense = params, params.get("projection", {}).get("embedding", {}).get("kernel")
      else:
        encoder, dense = params["encoder"], params.get("dense")
      inputs = (batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
      out = cast(EncoderOutput, model.apply({"params": encoder}, *inputs))  # no mutable collections: the output alone
      return embeddings.sentence_embeddings(out.last_hidden_state, batch["attention_mask"], pooling, dense)

    self.predict = Predictor(forward, mesh, parallel.replicated(mesh), batch_size)

  @classmethod
  def load(cls, path: str, mesh, batch_size: int, length: int) -> "SentenceEncoder":
    """A run's encoder (a fine-tuned run's; its teacher's pooling, its learnt Dense map) or a
    Hugging Face / sentence-transformers directory's, with its pooling and Dense layer."""
    config, params, tokenizer = runs.load_encoder(path, what="--embeddings")[:3]
    pooling, dense = runs.sentence_pipeline_of(path, length)
    if length > config.max_position_embeddings:
      raise UserError(f"--max_seq_length={length} exceeds {path}'s {config.max_position_embeddings} positions")
    return cls(Encoder(config), pooling, tokenizer, mesh, batch_size, length).use(params, dense)

  def use(self, encoder_params, dense) -> "SentenceEncoder":
    """Embeds with these parameters from now on: an encoder's, and its Dense map (None: no map)."""
    params = {"encoder": encoder_params, **({"dense": dense} if dense is not None else {})}
    self.params = jax.device_put(params, parallel.replicated(self.mesh))
    return self

  def __call__(self, texts, params=None, desc="embed") -> np.ndarray:
    features = sentence_features(self.tokenizer, texts, self.length)
    return self.predict(self.params if params is None else params, features, desc=desc)


def sentence_features(tokenizer, texts: list, length: int) -> datasets.Dataset:
  """The encoder inputs of `texts`, each truncated or padded to `length` tokens (one compiled shape)."""
  enc = tokenizer(list(texts), truncation=True, max_length=length, padding="max_length")
  return datasets.Dataset.from_dict(
    {
      "input_ids": enc["input_ids"],
      "attention_mask": enc["attention_mask"],
      "token_type_ids": enc.get("token_type_ids", [[0] * length for _ in texts]),
    }
  )


def evaluate_embeddings(
  models: list,
  out_dir: str | None,
  sts: str = "",
  wordnet_dir: str = "",
  batch_size: int = 64,
  max_seq_length: int = 128,
  mesh=None,
) -> list:
  """One row per model: WordNet retrieval, unrelated-pair cosine and (given an STS-B-format file)
  STS Spearman; written to `out_dir/embeddings.json`."""
  mesh = mesh or parallel.make_mesh()
  retrieval = wordnet_retrieval(wordnet_dir)
  pairs = glue.TASKS["stsb"].load_file(sts, labelled=True) if sts else None
  rows = []
  for path in models:
    model = SentenceEncoder.load(path, mesh, batch_size, max_seq_length)
    queries = model(retrieval.queries, desc="queries")
    row = {
      "model": path,
      "pooling": model.pooling.mode,
      "normalize": model.pooling.normalize,
      **retrieval_scores(queries, model(retrieval.documents, desc="documents"), retrieval.relevant),
      "unrelated_cosine": unrelated_cosine(queries),
    }
    if pairs is not None:
      row["sts_spearman"] = sts_spearman(
        model(pairs["text_a"], desc="sts"), model(pairs["text_b"], desc="sts"), pairs["label"]
      )
    rows.append(row)
  if out_dir:  # None: another process of a multi-process evaluation writes the results
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "embeddings.json"), "w") as f:
      json.dump(
        {
          "max_seq_length": max_seq_length,
          "queries": len(retrieval.queries),
          "documents": len(retrieval.documents),
          "rows": rows,
        },
        f,
        indent=2,
      )
  return rows
