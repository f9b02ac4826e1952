"""Where a model's parameters live on a mesh: split over the mesh's `model` axis as the encoder's
layout table says (`models.layout`, Megatron-style: Q/K/V and the first feed-forward matrix by
output column, the attention output and second feed-forward matrix by input row, the word
embeddings by vocabulary row), replicated otherwise. The rules read the layout, so they live with
the models; the mesh itself is `minilm_jax.devices.parallel`'s."""

import jax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from minilm_jax.devices.parallel import MODEL
from minilm_jax.models import layout


def _spec(path: str, shape, mesh: Mesh) -> P:
  """Where a parameter (or its optimizer moments, whose paths end the same) lives on the mesh: split
  as the encoder's layout says (`models.layout`), replicated when it says nothing or the split axis
  does not divide."""
  model = mesh.shape[MODEL]
  row = layout.find(path)
  if model == 1 or not shape or row is None or row.shard is None:
    return P()
  if row.shard == "column":
    spec = (None,) * (len(shape) - 1) + (MODEL,)
  else:
    spec = (MODEL,) + (None,) * (len(shape) - 1)
  axis = spec.index(MODEL)
  return P(*spec) if shape[axis] % model == 0 else P()


def tree_shardings(abstract_tree, mesh: Mesh):
  """NamedShardings for a tree of parameters or train state, by the rules above."""

  def sharding(path, leaf):
    name = "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)
    return NamedSharding(mesh, _spec(name, getattr(leaf, "shape", ()), mesh))

  return jax.tree_util.tree_map_with_path(sharding, abstract_tree)
