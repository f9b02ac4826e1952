"""Plain-text tables of result rows, for the console."""


def format_table(rows) -> str:
  """Rows of dicts -> aligned columns (every key of any row, in order of first appearance; "-" where
  a row lacks one, as a GLUE row lacks SQuAD's exact match); floats to 4 significant digits."""
  if not rows:
    return "(no rows)"
  columns = list(dict.fromkeys(c for r in rows for c in r))
  cell = lambda v: f"{v:.4g}" if isinstance(v, float) else ("-" if v is None else str(v))
  lines = [[cell(r.get(c)) for c in columns] for r in rows]
  widths = [max(len(c), *(len(l[i]) for l in lines)) for i, c in enumerate(columns)]
  fmt = lambda values: "  ".join(v.ljust(w) for v, w in zip(values, widths))
  return "\n".join([fmt(columns), fmt(["-" * w for w in widths])] + [fmt(l) for l in lines])
