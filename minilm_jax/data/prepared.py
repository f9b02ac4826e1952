"""A corpus tokenised and packed once (`python -m minilm_jax.prepare_data`), read by every process.

Layout of a prepared directory (local, or any `etils.epath` location such as `gs://`):
  manifest.json                 tokenizer identity, max_seq_length, counts, shards (each with its
                                sha256), source files,
                                and for a corpus in several languages each one's block count, in order
  blocks-00000-of-00004.npy     int32 [rows, max_seq_length]: `[CLS] ... [SEP]` blocks, padded
  lengths-00000-of-00004.npy    int32 [rows]: each block's real length

Fixed-length rows make a batch one numpy gather per shard and its mask one comparison, with no
Python loop per row; local shards are memory-mapped, so each process reads only the rows of its
part of every global batch. Remote shards are copied to a local cache once per host.
"""

import hashlib
import json
import os
from functools import partial

import numpy as np
from etils import epath
from tqdm import tqdm

from minilm_jax.data.corpus import BUILT_IN, pad_blocks
from minilm_jax.data.files import file_digest, written_whole
from minilm_jax.data.languages import LanguageBlocks, language_corpora, language_list, language_spans, load_corpus
from minilm_jax.errors import UserError

MANIFEST = "manifest.json"
FORMAT = 1


def tokenizer_identity(tokenizer) -> dict:
  """What must match between the corpus and the run: the vocabulary (hashed) and its special ids."""
  vocab = json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False).encode()
  return {
    "class": type(tokenizer).__name__,
    "vocab_size": len(tokenizer),
    "vocab_sha256": hashlib.sha256(vocab).hexdigest(),
    "pad_id": tokenizer.pad_token_id,
  }


def location(directory: str, field: str) -> tuple[str, epath.Path]:
  """(the directory as the programs name it, its `etils.epath` path): `file://` as the local path
  it names; one line for a location whose file system is not installed (gs:// without gcsfs) or
  that no file system reads."""
  if directory.startswith("file://"):
    directory = directory[len("file://") :]
  try:
    root = epath.Path(directory)
    root.exists()
  except ImportError as e:
    raise UserError(f"{field}={directory}: {e} (pip install gcsfs), or copy the directory to a local disk") from None
  except KeyError:
    raise UserError(
      f"{field}={directory}: no file system reads {directory.split('://')[0]}:// locations: use a local path or gs://"
    ) from None
  return directory, root


def write_prepared(blocks, tokenizer, max_seq_length: int, out_dir: str, num_shards: int, sources: list) -> dict:
  """Writes `blocks` (a dataset whose `input_ids` are packed `[CLS] ... [SEP]` blocks, or the
  `LanguageBlocks` of several languages) as padded shards plus the manifest, the manifest last: a
  directory without one was never completed."""
  languages = None
  if isinstance(blocks, LanguageBlocks):  # as `load_corpus` builds it: the languages one after another
    languages = {code: int(count) for code, count in zip(blocks.languages, blocks.counts)}
    blocks = blocks.rows
  out_dir, out = location(out_dir, "--out")
  if (out / MANIFEST).exists():
    raise UserError(f"{out_dir} already holds a prepared corpus: choose a new --out (or remove it)")
  out.mkdir(parents=True, exist_ok=True)
  num_shards = max(1, min(num_shards, len(blocks)))
  bounds = np.linspace(0, len(blocks), num_shards + 1).astype(int)
  shards, tokens = [], 0
  for i in tqdm(range(num_shards), desc="write shards", unit="shard"):
    padded = pad_blocks(blocks[int(bounds[i]) : int(bounds[i + 1])], max_seq_length, tokenizer.pad_token_id)
    ids, lengths = padded["input_ids"], padded["attention_mask"].sum(axis=1, dtype=np.int32)
    names = {kind: f"{kind}-{i:05d}-of-{num_shards:05d}.npy" for kind in ("blocks", "lengths")}
    for kind, array in (("blocks", ids), ("lengths", lengths)):
      with (out / names[kind]).open("wb") as f:
        np.save(f, array)
    # What the shard holds: two preparations with as many rows have files of the same size, and a
    # host's copy of a remote corpus is kept only while the manifest it was copied with is the same.
    digest = hashlib.sha256(np.ascontiguousarray(ids).data)
    digest.update(np.ascontiguousarray(lengths).data)
    shards.append({"rows": len(lengths), **names, "sha256": digest.hexdigest()})
    tokens += int(lengths.sum())
  manifest = {
    "format": FORMAT,
    "tokenizer": tokenizer_identity(tokenizer),
    "max_seq_length": max_seq_length,
    "blocks": len(blocks),
    "tokens": tokens,
    "shards": shards,
    "sources": sources,
    **({"languages": languages} if languages else {}),
  }
  (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
  return manifest


# The manifest's fields and their types: what reading a prepared corpus relies on.
_MANIFEST_FIELDS = {"format": int, "tokenizer": dict, "max_seq_length": int, "shards": list}
_SHARD_FIELDS = {"blocks": str, "lengths": str, "rows": int}


def _read_manifest(path, directory: str) -> dict:
  """The manifest, or one line naming it when it is not the JSON `write_prepared` writes."""
  fix = f"prepare the corpus {directory} again"
  try:
    manifest = json.loads(path.read_bytes().decode("utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise UserError(f"{path} is damaged (not JSON: {' '.join(str(e).split())[:60]}): {fix}") from None
  fields = dict(_MANIFEST_FIELDS)
  if not isinstance(manifest, dict) or any(not isinstance(manifest.get(k), t) for k, t in fields.items()):
    raise UserError(f"{path} is damaged (it lacks the fields {', '.join(fields)}): {fix}")
  for shard in manifest["shards"]:
    if not isinstance(shard, dict) or any(not isinstance(shard.get(k), t) for k, t in _SHARD_FIELDS.items()):
      raise UserError(f"{path} is damaged (a shard entry lacks {', '.join(_SHARD_FIELDS)}): {fix}")
  return manifest


def _shard(path, directory: str, rows: int) -> np.ndarray:
  """One shard, memory-mapped; one line naming it when it is missing, cut short or not a shard."""
  try:
    array = np.load(path, mmap_mode="r")
  except FileNotFoundError:
    raise UserError(f"{path} is missing from the prepared corpus {directory}: prepare the corpus again") from None
  except (ValueError, EOFError, OSError) as e:  # numpy's "mmap length is greater than file size", a damaged header, ...
    raise UserError(
      f"{path} is damaged ({' '.join(str(e).split())[:80]}): prepare the corpus {directory} again"
    ) from None
  if array.shape[0] != rows or array.dtype != np.int32:
    raise UserError(
      f"{path} holds {array.shape[0]} rows of {array.dtype}, the manifest says {rows} of int32: "
      f"prepare the corpus {directory} again"
    )
  return array


def _on_this_host(directory: str) -> bool:
  """A prepared directory every process reads in place (memory-mapped), not one copied here first."""
  return os.path.isdir(directory)


class PreparedBlocks:
  """The blocks of a prepared directory: `len()`, and `blocks[indices]` -> {"input_ids", "lengths"}
  (numpy, in the order of `indices`), what `BatchStream` gathers and `collate_prepared` pads."""

  def __init__(self, directory: str, tokenizer, max_seq_length: int, cache_dir: str):
    directory, root = location(directory, "data.prepared")
    if not (root / MANIFEST).exists():
      raise UserError(
        f"data.prepared={directory} holds no {MANIFEST}: prepare the corpus there first "
        f"(python -m minilm_jax.prepare_data --config <config> --out {directory})"
      )
    self.manifest = _read_manifest(root / MANIFEST, directory)
    self._check(directory, tokenizer, max_seq_length)
    local = root if _on_this_host(directory) else self._copy_local(root, cache_dir)
    self._ids = [_shard(local / s["blocks"], directory, s["rows"]) for s in self.manifest["shards"]]
    self._lengths = [_shard(local / s["lengths"], directory, s["rows"]) for s in self.manifest["shards"]]
    self._starts = np.cumsum([0] + [s["rows"] for s in self.manifest["shards"]])
    self._verify(local, directory, cache_dir)

  @property
  def identity(self) -> str:
    """What the corpus holds, as its manifest says: a digest of its shards' sha256s, block length and
    tokenizer (a run records it and a resume compares it: a corpus prepared anew at the same path
    is another corpus)."""
    m = self.manifest
    held = {"max_seq_length": m["max_seq_length"], "tokenizer": m["tokenizer"], "shards": m["shards"]}
    return hashlib.sha256(json.dumps(held, sort_keys=True).encode()).hexdigest()

  def _verify(self, local, directory: str, cache_dir: str):
    """Each shard's bytes against the sha256 its manifest holds, once per file as it is on disk: a
    shard verified before (`cache_dir`'s record of each file's size, modification time and inode) is
    not read again while the file system says it is unchanged. One line naming a shard that differs
    (rewritten or damaged after the corpus was prepared, at the same size)."""
    record = os.path.join(cache_dir, "prepared_verified.json") if cache_dir else ""
    try:
      with open(record, encoding="utf-8") as f:
        verified = json.load(f)
    except (OSError, ValueError):  # none yet (or none kept: no `cache_dir`), or one cut short
      verified = {}
    verified = verified if isinstance(verified, dict) else {}
    now = {}
    for shard, ids, lengths in zip(self.manifest["shards"], self._ids, self._lengths):
      if not isinstance(shard.get("sha256"), str):
        continue  # a manifest written without digests: nothing to compare with
      files = [os.path.abspath(str(local / shard[kind])) for kind in ("blocks", "lengths")]
      stamp = [[s.st_size, s.st_mtime_ns, s.st_ino] for s in map(os.stat, files)]
      key = "|".join(files)
      if verified.get(key) != {"stat": stamp, "sha256": shard["sha256"]}:
        digest = hashlib.sha256(np.ascontiguousarray(ids).data)
        digest.update(np.ascontiguousarray(lengths).data)
        if digest.hexdigest() != shard["sha256"]:
          raise UserError(
            f"{local / shard['blocks']} (with {shard['lengths']}) holds other blocks than {directory}/{MANIFEST} "
            f"says (their sha256 differs): the shard changed after the corpus was prepared; prepare it again"
          )
      now[key] = {"stat": stamp, "sha256": shard["sha256"]}
    if record and now != verified:
      os.makedirs(cache_dir, exist_ok=True)
      with written_whole(record) as pending, open(pending, "w", encoding="utf-8") as f:
        json.dump(now, f)

  def _check(self, directory: str, tokenizer, max_seq_length: int):
    m = self.manifest
    if m.get("format") != FORMAT:
      raise UserError(
        f"{directory} was prepared in format {m.get('format')}, this version reads {FORMAT}: prepare it again"
      )
    if m["max_seq_length"] != max_seq_length:
      raise UserError(
        f"{directory} holds blocks of {m['max_seq_length']} tokens but data.max_seq_length={max_seq_length}: "
        f"set data.max_seq_length={m['max_seq_length']} or prepare the corpus again"
      )
    ours = tokenizer_identity(tokenizer)
    lacking = sorted(set(ours) - set(m["tokenizer"]))
    if lacking:  # every manifest records them all: one that lacks some was damaged after writing
      raise UserError(
        f"{epath.Path(directory) / MANIFEST} is damaged (its tokenizer lacks {', '.join(lacking)}): "
        f"prepare the corpus {directory} again"
      )
    if m["tokenizer"] != ours:
      differ = [k for k in ours if m["tokenizer"].get(k) != ours[k]]
      raise UserError(
        f"{directory} was prepared with another tokenizer ({', '.join(differ)} differ) than the teacher's: "
        f"prepare the corpus with this teacher's config"
      )

  def _copy_local(self, root, cache_dir: str):
    """Remote shards copied once into `cache_dir`: a file already there whole is kept while the
    corpus is the one it was copied from (the manifest copied after its shards says which; each
    shard's sha256 is in it), and every shard is copied again after the corpus was prepared anew (a
    copy cut short keeps the older manifest, so the next run copies again too)."""
    local = epath.Path(cache_dir) / "prepared"
    local.mkdir(parents=True, exist_ok=True)
    copied = local / MANIFEST
    same = copied.exists() and copied.read_text() == json.dumps(self.manifest)
    for shard in tqdm(self.manifest["shards"], desc="copy prepared shards", unit="shard"):
      for name in (shard["blocks"], shard["lengths"]):
        target = local / name
        if not same or not target.exists() or target.stat().length != (root / name).stat().length:
          (root / name).copy(target, overwrite=True)
    if not same:  # whole or not at all: another process of this host may be reading it
      with written_whole(str(copied)) as pending, open(pending, "w", encoding="utf-8") as f:
        f.write(json.dumps(self.manifest))
    return local

  def __len__(self) -> int:
    return int(self._starts[-1])

  def __getitem__(self, indices) -> dict:
    indices = np.asarray(indices)
    shard = np.searchsorted(self._starts, indices, side="right") - 1
    ids = np.empty((len(indices), self.manifest["max_seq_length"]), np.int32)
    lengths = np.empty(len(indices), np.int32)
    for s in np.unique(shard):
      where = shard == s
      rows = indices[where] - self._starts[s]
      ids[where], lengths[where] = self._ids[s][rows], self._lengths[s][rows]
    return {"input_ids": ids, "lengths": lengths}


def collate_prepared(rows: dict) -> dict:
  """Gathered fixed-length blocks -> BERT inputs (the same arrays `corpus.pad_blocks` makes)."""
  ids, lengths = rows["input_ids"], rows["lengths"]
  mask = (np.arange(ids.shape[1])[None, :] < lengths[:, None]).astype(np.int32)
  return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def corpus_blocks(data_config, tokenizer, cache_dir: str):
  """(blocks, collate, read) of a run's corpus: the prepared directory `data.prepared`, or the corpus
  tokenised and packed here (cached under `cache_dir`). `read`: {field: (its value, a digest of what
  it holds)}, what a run records and a resume compares (`RunRecord.inputs`): the prepared corpus's
  `identity`, or the sha256s of the local files tokenised here (their tokenised cache follows their
  paths and modification times, not their bytes); empty for a built-in or hub corpus."""
  if data_config.prepared:
    blocks = PreparedBlocks(data_config.prepared, tokenizer, data_config.max_seq_length, cache_dir)
    read = {"data.prepared": (data_config.prepared, blocks.identity)}
    return _prepared_languages(blocks, data_config), collate_prepared, read
  blocks = load_corpus(data_config, tokenizer, cache_dir)
  # A built-in corpus is written by this package's code, a hub one is named: no local bytes to digest.
  named = [
    f.strip() for _, one in language_corpora(data_config) if one.corpus not in BUILT_IN for f in one.corpus.split(",")
  ]
  files = [f for f in named if os.path.isfile(f)]
  digest = hashlib.sha256(json.dumps([file_digest(f) for f in files]).encode()).hexdigest()
  read = {"data.corpus": (data_config.corpus, digest)} if files else {}
  return blocks, partial(pad_blocks, seq_len=data_config.max_seq_length, pad_id=tokenizer.pad_token_id), read


def _prepared_languages(blocks: PreparedBlocks, data_config):
  """The prepared blocks, as `LanguageBlocks` when they hold several languages; the languages must
  be the config's (`data.languages`, in its order), for the run to sample what it names."""
  prepared = blocks.manifest.get("languages") or {}
  if not isinstance(prepared, dict) or sum(prepared.values()) not in (0, len(blocks)):
    raise UserError(
      f"{data_config.prepared}/{MANIFEST} is damaged (its languages do not add up to its blocks): prepare it again"
    )
  listed = language_list(data_config)
  if list(prepared) != listed:
    raise UserError(
      f"data.prepared={data_config.prepared} holds the languages [{','.join(prepared)}] and data.languages "
      f"is [{','.join(listed)}]: set data.languages={','.join(prepared)} or prepare the corpus with this config"
    )
  if not prepared:
    return blocks
  return LanguageBlocks(blocks, language_spans(prepared), data_config.language_alpha)
