"""Pictures of what distillation transfers: teacher and student attention maps side by side
(as the MiniLM supplementary's figures 1-3)."""

import matplotlib

matplotlib.use("Agg")  # files only: no display on training machines
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def attention_figure(maps: dict, tokens, heads):
  """maps: row title -> attention [heads, length, length] of one sentence; one column per head."""
  fig, axes = plt.subplots(len(maps), len(heads), figsize=(2.6 * len(heads), 2.8 * len(maps)), squeeze=False)
  for r, (title, attention) in enumerate(maps.items()):
    for c, h in enumerate(heads):
      ax = axes[r][c]
      ax.imshow(np.asarray(attention[h]), cmap="viridis", vmin=0.0, vmax=1.0)
      ax.set_title(f"{title}, head {h}", fontsize=8)
      ax.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=5)
      ax.set_yticks(range(len(tokens)), tokens, fontsize=5)
  fig.tight_layout()
  return fig
