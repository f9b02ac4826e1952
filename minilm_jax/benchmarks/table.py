"""Plain-text tables of result rows, for the console."""


def format_table(rows) -> str:
  """Rows of dicts with the same keys -> aligned columns; floats to 4 significant digits."""
  if not rows:
    return "(no rows)"
  columns = list(rows[0])
  cell = lambda v: f"{v:.4g}" if isinstance(v, float) else ("-" if v is None else str(v))
  lines = [[cell(r[c]) for c in columns] for r in rows]
  widths = [max(len(c), *(len(l[i]) for l in lines)) for i, c in enumerate(columns)]
  fmt = lambda values: "  ".join(v.ljust(w) for v, w in zip(values, widths))
  return "\n".join([fmt(columns), fmt(["-" * w for w in widths])] + [fmt(l) for l in lines])
