"""The fused Pallas kernels (`minilm_jax.kernels`) in Pallas's interpret mode on the CPU, held to
the explicit paths they replace: values to 1e-6 relative, gradients to 1e-4, padding contributing
nothing, the dropout mask the one a reference draws from the same bits. Inside the sharded step
they are compiled for H100s and TPUs in `tests/test_aot.py`: Pallas's interpreter (jax 0.10.2)
cannot run inside `shard_map` ("Primitive dynamic_slice requires varying manual axes to match"),
so the CPU steps keep the explicit path."""

import importlib.util
import json
import os
import re
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import traverse_util

from conftest import TEST_UMASK, modes_not_from_the_umask, run_in_process
from minilm_jax.benchmarks import kernels as kernel_check
from minilm_jax.devices import parallel, timing
from minilm_jax.devices.chips import GiB
from minilm_jax.errors import UserError
from minilm_jax.kernels import attention, dropout, platform, relation_kl
from minilm_jax.kernels.layout import Layout
from minilm_jax.kernels.platform import TILINGS, Tiling, kernel_platform
from minilm_jax.transfer import relations

# [B, L, H, K] operands, as the encoder makes them; two key blocks of 128, so that the online
# softmax crosses a block boundary.
B, H, L, K = 2, 3, 256, 32
MASK = jnp.arange(L)[None, :] < jnp.array([L, 77])[:, None]  # the second example padded after 77 tokens


def _normal(seed, shape, scale=1.0):
  return scale * jax.random.normal(jax.random.key(seed), shape, jnp.float32)


def _rel(a, b):
  return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))


# The drawn rate of 0.1: bytes of at least 26 of 256 are kept (`dropout.threshold`).
DROPPED = 26 / 256


def test_dropout_bits_keep_the_rate_and_differ_by_seed_and_position():
  keep = np.asarray(dropout.keep_mask(jnp.int32(7), 4, 12, 128, 0.1))
  # 786,432 draws: the kept share is within 5 standard errors (0.0017) of the drawn 1 - 26/256.
  assert abs(keep.mean() - (1 - DROPPED)) < 0.0017
  again = np.asarray(dropout.keep_mask(jnp.int32(7), 4, 12, 128, 0.1))
  other = np.asarray(dropout.keep_mask(jnp.int32(8), 4, 12, 128, 0.1))
  assert (keep == again).all()
  # Independent masks agree on p^2 + (1 - p)^2 of the entries; neighbours are uncorrelated, the
  # four keys of one word (keys 4w to 4w + 3: lags 1-3) and the next word's (lag 4) alike.
  assert abs((keep == other).mean() - (DROPPED**2 + (1 - DROPPED) ** 2)) < 0.005
  for lag in (1, 2, 3, 4):
    assert abs(np.corrcoef(keep[..., :-lag].ravel(), keep[..., lag:].ravel())[0, 1]) < 0.01
  assert abs(np.corrcoef(keep[:, :-1].ravel(), keep[:, 1:].ravel())[0, 1]) < 0.01
  assert bool(dropout.keep_mask(jnp.int32(7), 1, 1, 64, 0.0).all()) and dropout.threshold(0.1) == 26
  assert dropout.scale(0.1) == 256 / 230 and dropout.threshold(0.002) == 1
  with pytest.raises(UserError, match="below 1/512"):
    dropout.threshold(0.001)
  assert dropout.threshold(0.998) == 255
  with pytest.raises(UserError, match="dropout rate=0.999 rounds to 256/256"):
    dropout.threshold(0.999)


@pytest.mark.parametrize(("queries", "keys"), [(128, 128), (10, 13)])
def test_a_word_hashed_once_for_four_keys_is_the_mask_entry_by_entry(queries, keys):
  """`keep_mask` spreads each word over its four keys (as the kernels do); `entry_keeps` hashes
  each entry's word on its own (the kernels' path for a whole odd length): the same mask, a key
  length that is not a multiple of four (a decoding cache) included."""
  batch, heads = 2, 3
  row_head = jnp.arange(batch)[:, None, None, None] * heads + jnp.arange(heads)[None, :, None, None]
  base = dropout.row_base(jnp.int32(7), row_head)
  entries = dropout.entry_keeps(base, jnp.arange(queries)[:, None], jnp.arange(keys)[None, :], keys, 0.1)
  assert np.array_equal(dropout.keep_mask(jnp.int32(7), batch, heads, queries, 0.1, keys), entries)


def test_hidden_dropout_keeps_the_rate_scales_the_kept_and_differs_by_seed_and_position():
  """The encoder's hidden-state dropout (`encoder.Dropout`, the same words over each entry's index):
  a [16, 128, 384] activation as the 3x384 student's step drops it out."""
  from minilm_jax.models.encoder import Dropout

  x = jnp.ones((16, 128, 384))
  keep = np.asarray(dropout.keep_like(jnp.int32(7), x.shape, 0.1))
  assert abs(keep.mean() - (1 - DROPPED)) < 0.0017  # 786,432 draws, as above
  agree = DROPPED**2 + (1 - DROPPED) ** 2
  assert abs((keep == np.asarray(dropout.keep_like(jnp.int32(8), x.shape, 0.1))).mean() - agree) < 0.005
  for axis in range(3):  # neighbours along every axis are uncorrelated
    a, b = np.moveaxis(keep, axis, 0)[:-1].ravel(), np.moveaxis(keep, axis, 0)[1:].ravel()
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.01
  layer = Dropout(0.1)
  y = np.asarray(layer.apply({}, x, False, rngs={"dropout": jax.random.key(0)}))
  assert np.allclose(np.unique(y), [0.0, 256 / 230]) and abs((y > 0).mean() - (1 - DROPPED)) < 0.0017
  assert np.array_equal(layer.apply({}, x, True), x) and not np.any(Dropout(1.0).apply({}, x, False))


# Each chip's layout and blocks: the operands as the model makes them in 64-row blocks (GPUs: four
# blocks here), and the TPU's [B, H, K, L] in 128-row blocks. The GPU's four interpreted blocks take
# about 5 s a test on 2 cores: `slow`.
CHIPS = [
  pytest.param(None, TILINGS["gpu"], id="gpu_layout_and_blocks", marks=pytest.mark.slow),
  pytest.param(Layout("bhkl"), TILINGS["tpu"], id="tpu_layout_and_blocks"),
]


@pytest.mark.parametrize(("layout", "tiling"), CHIPS)
@pytest.mark.parametrize("rate", [0.0, 0.1])
def test_flash_attention_equals_the_explicit_path_with_the_same_bits(rate, layout, tiling):
  q, k, v = (_normal(i, (B, L, H, K)) for i in range(3))
  cotangent = _normal(3, (B, L, H, K))
  seed = jnp.int32(1234)

  def loss(fn):
    return lambda q, k, v: jnp.sum(fn(q, k, v) * cotangent * MASK[:, :, None, None])

  fused = loss(lambda q, k, v: attention.flash_attention(q, k, v, MASK, seed, rate, "cpu", layout, tiling))
  explicit = loss(lambda q, k, v: attention.reference(q, k, v, MASK, seed, rate))
  assert abs(float(fused(q, k, v)) / float(explicit(q, k, v)) - 1) < 1e-6
  fused_grads, explicit_grads = jax.grad(fused, (0, 1, 2))(q, k, v), jax.grad(explicit, (0, 1, 2))(q, k, v)
  for got, want in zip(fused_grads, explicit_grads):
    assert _rel(got, want) < 1e-4
  # Padding keys get no gradient: nothing attends to them.
  for grad in fused_grads[1:]:
    assert float(jnp.max(jnp.abs(grad[1, 77:]))) == 0.0
  # The dropout mask is the reference's: changing the seed changes the output.
  if rate:
    other = attention.flash_attention(q, k, v, MASK, seed + 1, rate, "cpu", layout, tiling)
    assert _rel(other, attention.reference(q, k, v, MASK, seed, rate)) > 1e-2


@pytest.mark.parametrize(("layout", "tiling"), CHIPS)
@pytest.mark.parametrize("widths", [(64, 32), (32, 64)])
def test_fused_relation_kl_equals_the_explicit_kl(widths, layout, tiling):
  """Teacher and student of different relation-head widths, a padded example; the explicit path
  is `relations.relation_kl` over the full [B, A_r, L, L] relations, and a float64 numpy reference."""
  d_t, d_s = widths
  tx, ty = _normal(0, (B, 4, L, d_t)), _normal(1, (B, 4, L, d_t))
  sx, sy = _normal(2, (B, 4, L, d_s)), _normal(3, (B, 4, L, d_s))

  def explicit(sx, sy):
    t, s = relations._log_probs(tx, ty, MASK), relations._log_probs(sx, sy, MASK)
    return relations.relation_kl(t, s, MASK)

  def fused(sx, sy):
    rows = relation_kl.relation_kl_rows((tx, ty), (sx, sy), MASK, "cpu", layout, tiling)
    return relations._normalise(jnp.sum(rows * MASK[:, None, :], axis=(1, 2)), 4, MASK)

  assert abs(float(fused(sx, sy)) / float(explicit(sx, sy)) - 1) < 1e-6
  for got, want in zip(jax.grad(fused, (0, 1))(sx, sy), jax.grad(explicit, (0, 1))(sx, sy)):
    assert _rel(got, want) < 1e-4
  # Padding keys of the student get no gradient, and the float64 value agrees.
  assert float(jnp.max(jnp.abs(jax.grad(fused, 1)(sx, sy)[1, :, 77:]))) == 0.0

  def log_probs(x, y):
    logits = np.einsum("bhqd,bhkd->bhqk", np.float64(x), np.float64(y)) / np.sqrt(x.shape[-1])
    logits = np.where(np.asarray(MASK)[:, None, None, :], logits, -1e9)
    logits -= logits.max(-1, keepdims=True)
    return logits - np.log(np.exp(logits).sum(-1, keepdims=True))

  t, s = log_probs(tx, ty), log_probs(sx, sy)
  rows = (np.exp(t) * (t - s)).sum(-1) * np.asarray(MASK)[:, None, :]
  want = np.mean(rows.sum((1, 2)) / (4 * np.asarray(MASK).sum(-1)))
  assert abs(float(fused(sx, sy)) / want - 1) < 1e-6


def test_the_cpu_keeps_the_explicit_path():
  assert kernel_platform() is None


def test_the_chip_check_holds_both_kernels_to_the_explicit_path_in_every_tiling():
  """`python -m minilm_jax.bench kernels`, interpreted here: one row per kernel and tiling, the
  errors float32's."""
  rows = kernel_check.run([128], batch=2, dtype="float32", repeats=1, tilings=[Tiling(64), Tiling(32, 8, 3)])
  assert [(r["kernel"], r["tiling"]) for r in rows] == [
    ("attention", "64x4x2"),
    ("relation_kl", "64x4x2"),
    ("attention", "32x8x3"),
    ("relation_kl", "32x8x3"),
  ]
  for r in rows:
    assert r["platform"] == "cpu" and max(r["loss_error"], r["grad_error"]) < 1e-5, r
    assert r["fused_ms"] > 0 and r["explicit_ms"] > 0


def test_each_kernels_bound_on_an_h100_from_its_counted_work():
  """`bench kernels`' bound at the paper's batch 256 x 512 (12 heads of 32; relations 64 -> 32), by
  hand from the per-entry counts (`kernels.costs`) and the H100's rates (`chips.CHIPS`): the
  attention is bound by its vector instructions' issue (38.5 an entry forward and backward: 2 x 8.25
  of the mask, 18 others, 2 x 2 for the exponentials), not by its 448 FLOPs of products an entry,
  and the relation KL's forward likewise (13 others, 2 exponentials of 2), its backward by its 2
  exponentials on the 16 transcendental units a clock; at 128 both kernels are bound by HBM."""
  from minilm_jax.devices.chips import CHIPS

  h100, entries = CHIPS["h100"], 256 * 12 * 512 * 512
  issue = 128 * 132 * 1.98e9
  attention_work = kernel_check.work("attention", 256, 512, 2)
  assert sum(w.products for w in attention_work.values()) == 14 * 32 * entries
  assert sum(w.integer_ops for w in attention_work.values()) == 2 * (13 / 4 + 5) * entries
  seconds, limit = kernel_check.bound(attention_work, h100)
  assert limit == "issue" and seconds == pytest.approx((2 * 8.25 + 18 + 2 * 2) * entries / issue)
  relation_work = kernel_check.work("relation_kl", 256, 512, 2)
  assert sum(w.products for w in relation_work.values()) == (4 * 64 + 8 * 32) * entries
  seconds, limit = kernel_check.bound(relation_work, h100)
  assert limit == "issue" and seconds == pytest.approx(
    (13 + 2 * 2) * entries / issue + 2 * entries / (16 * 132 * 1.98e9)
  )
  for kernel in ("attention", "relation_kl"):
    assert kernel_check.bound(kernel_check.work(kernel, 256, 128, 2), h100)[1] == "hbm"


def test_the_compiled_programs_flops_and_the_steps_parts_are_the_kernels_counts():
  """One count: `aot`'s check reads a compiled call's products from its operands (`costs.FLOPS`),
  the step's parts (`models.flops`) from the shapes; both equal the kernels' own `costs` work."""
  from minilm_jax.kernels import costs
  from minilm_jax.models import flops

  batch, length = 4, 128
  work = costs.attention(batch, 12, length, 32, 0.1) | costs.relation_kl(batch, 12, length, 64, 32)
  attention_operands = [[1, 1], [batch, length, 1], [batch, length, 12, 32]]
  relation_operands = [[batch, length, 1], [batch, 12, length, 64], [batch, 12, length, 64], [batch, 12, length, 32]]
  for name, operands in [(attention.FORWARD, attention_operands), (attention.BACKWARD, attention_operands)] + [
    (relation_kl.FORWARD, relation_operands),
    (relation_kl.BACKWARD, relation_operands),
  ]:
    assert costs.FLOPS[name](operands) == work[name].products, name
  assert flops.attention_kernel_flops(batch, length, 384) == (
    work[attention.FORWARD].products,
    work[attention.BACKWARD].products,
  )
  assert flops.relation_kl_flops(batch, length, 768, 384) == (
    work[relation_kl.FORWARD].products,
    work[relation_kl.BACKWARD].products,
  )


@pytest.mark.slow
def test_the_tuner_writes_the_fastest_tiling_per_kernel_and_the_step_reads_it(tmp_path, monkeypatch):
  """`bench kernels --tune` over two tilings, interpreted: a row per kernel call and tiling, the
  fastest of each call written to the table with the chip and the date; the kernels then take the
  table's tilings (their Pallas grids), forward and backward each their own, and a shape without an
  entry the platform's."""
  from minilm_jax.kernels import platform

  table = tmp_path / "tuned.json"
  monkeypatch.setattr(platform, "TUNED_TABLE", str(table))
  rows = kernel_check.tune([64], batch=2, dtype="float32", repeats=1, tilings=[Tiling(16), Tiling(32)])
  calls = [attention.FORWARD, attention.BACKWARD, relation_kl.FORWARD, relation_kl.BACKWARD]
  assert sorted((r["kernel"], r["tiling"]) for r in rows) == sorted((c, t) for c in calls for t in ("16x4x2", "32x4x2"))
  written = json.loads(table.read_text())
  assert len(written) == 4 and all(e["chip"] == "cpu" and e["date"] and e["length"] == 64 for e in written.values())
  for entry in written.values():
    times = [r["ms"] for r in rows if r["kernel"] == entry["kernel"]]
    assert entry["ms"] == min(times) and entry["tiling"] == rows[[r["ms"] for r in rows].index(min(times))]["tiling"]
  # A different block on each pass, so that what each call is given shows which entry it read.
  forward_key = platform.tuned_key("cpu", attention.FORWARD, (32,), 64)
  backward_key = platform.tuned_key("cpu", attention.BACKWARD, (32,), 64)
  written[forward_key]["tiling"], written[backward_key]["tiling"] = "16x4x2", "32x8x3"
  table.write_text(json.dumps(written))
  platform.tuned_tilings.cache_clear()
  given = []
  monkeypatch.setattr(
    attention,
    "call",
    lambda kernel, where, name, tiling, **kw: (
      given.append((name, tiling)) or (platform.call(kernel, where, name, tiling, **kw))
    ),
  )
  for length in (64, 128):  # 128: no entry
    mask = jnp.ones((1, length), bool)
    jax.grad(lambda q, mask=mask: jnp.sum(attention.flash_attention(q, q, q, mask, 3, 0.1, "cpu")))(
      _normal(0, (1, length, 2, 32))
    )
  assert given == [
    (attention.FORWARD, Tiling(16)),
    (attention.BACKWARD, Tiling(32, 8, 3)),
    (attention.FORWARD, TILINGS["cpu"]),
    (attention.BACKWARD, TILINGS["cpu"]),
  ]
  platform.tuned_tilings.cache_clear()


@pytest.mark.slow
def test_the_chip_check_program_writes_its_rows_and_refuses_bad_input(tmp_path, capfd):
  """Exit 0 with its rows, exit 2 with one line for bad input (a malformed tiling; bfloat16 on a CPU,
  whose XLA cannot run the explicit path's bfloat16 products), and exit 1 only for a kernel beyond
  tolerance."""
  out = tmp_path / "kernels.json"
  bench = ["bench", "kernels"]
  ok = run_in_process(
    *bench,
    "--seq_len=32",
    "--batch=2",
    "--dtype=float32",
    "--repeats=1",
    f"--json={out}",
    capfd=capfd,
    umask=TEST_UMASK,
  )
  assert ok.returncode == 0, ok.stderr[-2000:]
  assert not modes_not_from_the_umask(str(out))  # a report, as every bench suite writes one
  assert "relation_kl  128x4x2/128x4x2  cpu" in ok.stdout and len(json.loads(out.read_text())) == 2
  for flag, message in (
    ("--tilings=64x4x2,big", "error: --tilings 64x4x2,big: write each as BLOCKxWARPSxSTAGES, e.g. 64x4x2"),
    (
      "--tilings=0x4x2",
      "error: --tilings 0x4x2: a block is a power of two from 8 rows, warps a power of two from 1 to 32, stages 1 "
      "or more",
    ),
    (  # was a traceback from the allocator
      "--batch=100000000",
      f"error: --batch 100000000 --seq_len 128: the inputs and the explicit path take at least 347,900.4 GiB, and "
      f"this device has {timing.device_memory_bytes() / GiB:,.1f} GiB: lower --batch or --seq_len",
    ),
    (
      "--dtype=bfloat16",
      "error: --dtype bfloat16: XLA's CPU backend cannot run bfloat16 products: use --dtype float32 on a CPU",
    ),
  ):
    bad = run_in_process(*bench, flag, capfd=capfd)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [message], bad.stderr[-2000:]
  rows = json.loads(out.read_text())
  assert kernel_check.beyond_tolerance(rows) == []
  assert kernel_check.beyond_tolerance([{**rows[0], "grad_error": 0.01}]) == [{**rows[0], "grad_error": 0.01}]


@pytest.mark.parametrize(
  "damage, reason",
  [
    ('{"H100|minilm_flash_fwd|32|128": {"tiling": "64x4', "Unterminated string"),  # cut short
    ("", "Expecting value"),
    ('{"H100|minilm_flash_fwd|32|128": {"tiling": "0x4x2"}}', "has the tiling '0x4x2': a block is a power of two"),
    ('[{"tiling": "64x4x2"}]', "it holds a JSON list, not an object of entries"),
    ('{"H100|minilm_flash_fwd|32|128": "64x4x2"}', "its entry 'H100|minilm_flash_fwd|32|128' has no tiling"),
  ],
)
def test_a_damaged_tuned_table_is_one_line_naming_it(tmp_path, monkeypatch, damage, reason):
  """Every GPU and TPU step reads the tuned table as it traces its kernels (and `bench kernels`
  everywhere): a damaged one was a 48-62-line traceback that never named the file."""
  table = tmp_path / "tuned_tilings.json"
  table.write_text(damage)
  monkeypatch.setattr(platform, "TUNED_TABLE", str(table))
  with pytest.raises(
    UserError, match=f"the tuned tilings {table} cannot be read \\(.*{re.escape(reason)}.*restore the file"
  ):
    kernel_check.run([32], 2, "float32", 1)
  with pytest.raises(UserError, match="cannot be read"):  # tuning refuses it before its timings
    kernel_check.tune([32], 2, "float32", 1, [Tiling(32)], str(table))


@pytest.mark.xdist_group("aot")  # with the other compiles for targets, on the worker that loads their plugins
@pytest.mark.skipif(
  importlib.util.find_spec("libtpu") is None or importlib.util.find_spec("jax_cuda12_plugin") is None,
  reason='the aot extra is not installed: pip install -e ".[aot]" (CI installs it)',
)
@pytest.mark.parametrize("target", ["h100x1", "v5e-8"])
def test_the_kernels_compile_for_h100_and_tpu(target):
  """Both kernels, forward and backward, in bfloat16 at length 384 (three blocks: Triton takes only
  arrays whose sizes are powers of two, so no whole 384-row block is loaded or stored), compiled
  ahead of time for an
  H100 (Triton) and a TPU v5e (Mosaic, which the steps do not use yet: `kernels.platform`): each
  appears in the compiled program by name."""
  from minilm_jax.aot.targets import compile_devices, parse_target

  chosen = parse_target(target)
  platform = chosen.chip.platform
  mesh = jax.sharding.Mesh(compile_devices(chosen)[:1], ("data",))
  whole = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

  def grads(q, k, v, tx, ty, mask):
    def loss(q, k, v):
      context = attention.flash_attention(q, k, v, mask, 3, 0.1, platform)
      kl = relation_kl.relation_kl_rows((tx, ty), (q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3)), mask, platform)
      return jnp.sum(context.astype(jnp.float32)) + jnp.sum(kl)

    return jax.grad(loss, (0, 1, 2))(q, k, v)

  student = jax.ShapeDtypeStruct((2, 384, 12, 32), jnp.bfloat16, sharding=whole)
  teacher = jax.ShapeDtypeStruct((2, 12, 384, 64), jnp.bfloat16, sharding=whole)
  mask = jax.ShapeDtypeStruct((2, 384), jnp.bool_, sharding=whole)
  text = jax.jit(grads).lower(student, student, student, teacher, teacher, mask).compile().as_text()
  for name in (attention.FORWARD, attention.BACKWARD, relation_kl.FORWARD, relation_kl.BACKWARD):
    assert name in text, name
  if platform == "cuda":
    # `bench kernels`' reference on GPUs: cuDNN's attention without dropout, forward and backward,
    # the padding as lengths, at the students' heads of 32 (the teacher only ever runs it forward).
    program = jax.jit(parallel.traced_on_mesh(jax.value_and_grad(kernel_check.cudnn_loss, (0, 1, 2)), mesh))
    heads = jax.ShapeDtypeStruct((2, 12, 384, 32), jnp.bfloat16, sharding=whole)
    compiled = program.lower(heads, heads, heads, mask).compile().as_text()
    assert "__cudnn$fmhaSoftmax" in compiled and "__cudnn$fmhaSoftmaxBackward" in compiled


def test_the_chip_benchmarks_script_runs_the_check_then_one_step_per_process(tmp_path):
  """`launch/chip_benchmarks.sh` with a stand-in for python that records its arguments (the
  programs themselves are tested above and in test_bench.py): the tuner, then the check, then one
  `bench distill` per (student, length), each writing its own JSON; a failing program fails the
  script."""
  log = tmp_path / "calls"
  python = tmp_path / "python"
  python.write_text(f'#!/usr/bin/env bash\necho "$*" >> {log}\n[[ "$*" != *"seq_len 128"* ]]\n')
  python.chmod(0o755)
  script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "launch", "chip_benchmarks.sh")
  proc = subprocess.run(
    ["bash", script, str(tmp_path / "out"), "6x384 6x768", "512 128"],
    env={**os.environ, "PYTHON": str(python)},
    capture_output=True,
    text=True,
  )
  calls = log.read_text().splitlines()
  assert proc.returncode == 1  # the stand-in failed the length-128 runs
  assert calls[0].startswith("-m minilm_jax.bench kernels --tune --seq_len 128,512 --batch 256 --dtype bfloat16")
  assert calls[1].startswith("-m minilm_jax.bench kernels --seq_len 128,512 --batch 256 --dtype bfloat16")
  calls = calls[1:]
  # the train program at each student's first length
  assert [c.split("--train_steps ")[1].split()[0] for c in calls[1:]] == ["100", "0", "100", "0"]
  assert [c.split("--student ")[1].split(" --dtype")[0] for c in calls[1:]] == [
    "6x384 --seq_len 512",
    "6x384 --seq_len 128",
    "6x768 --seq_len 512",
    "6x768 --seq_len 128",
  ]
  assert all(f"--json {tmp_path}/out/distill_" in c and f"--profile {tmp_path}/out/profile_" in c for c in calls[1:])


@pytest.mark.slow
def test_the_encoder_trained_as_on_an_accelerator_equals_the_encoder_that_keeps_everything(monkeypatch):
  """Training on an accelerator each layer is rematerialised (`encoder._RematerialisedLayer`: its
  backward pass keeps Q, K, V, the kernel's output and log-sum-exp, the layer norms' inputs and the
  pre-activation, and recomputes the rest). With the flash kernel interpreted here, the same
  dropout drawn both ways: the loss to 1e-5 relative and every parameter's gradient to 1e-4. A
  CPU's explicit path (no kernel) drops the same entries: the same loss and gradients."""
  from minilm_jax.models import encoder

  config = encoder.EncoderConfig(
    vocab_size=60, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_position_embeddings=64
  )
  params = encoder.init_params(config, jax.random.key(0))
  ids = jnp.asarray(np.random.default_rng(0).integers(1, 60, (2, 32)))
  mask = (jnp.arange(32)[None] < jnp.array([32, 9])[:, None]).astype(jnp.int32)

  def loss(params):
    out = encoder.Encoder(config).apply(
      {"params": params}, ids, mask, deterministic=False, rngs={"dropout": jax.random.key(3)}
    )
    return jnp.sum(out.last_hidden_state * jnp.cos(jnp.arange(32))) + jnp.sum(out.layers[-1].q * 0.1)

  # A CPU's own path first: no kernel, its explicit attention making the kernel's dropout mask.
  loss_cpu, grads_cpu = jax.jit(jax.value_and_grad(loss))(params)  # traced anew each time: under each patch
  monkeypatch.setattr(encoder, "kernel_platform", lambda: "cpu")
  results = {}
  for rematerialised in (True, False):
    monkeypatch.setattr(encoder, "on_accelerator", lambda value=rematerialised: value)
    results[rematerialised] = jax.jit(jax.value_and_grad(loss))(params)
  (loss_remat, grads_remat), (loss_kept, grads_kept) = results[True], results[False]
  # Float32 sums of some 2,000 terms, fused differently by each program: a few of their ulps (1.1e-6
  # relative on an AVX-512 host's codegen); a wrong mask or a lost layer moves the loss by percents.
  assert abs(float(loss_remat) / float(loss_kept) - 1) < 1e-5
  assert abs(float(loss_cpu) / float(loss_kept) - 1) < 1e-5
  for name, want in traverse_util.flatten_dict(grads_kept, sep="/").items():
    if not name.endswith("key/bias") and not name.startswith("pooler/"):  # as below
      assert _rel(traverse_util.flatten_dict(grads_cpu, sep="/")[name], want) < 1e-4, name
  flat_remat, flat_kept = (traverse_util.flatten_dict(g, sep="/") for g in (grads_remat, grads_kept))
  assert flat_remat.keys() == flat_kept.keys() and len(flat_kept) > 20
  for name, want in flat_kept.items():
    # The key bias's exact gradient is 0 (softmax ignores q.b): both ways give rounding noise there.
    if name.endswith("key/bias"):
      continue
    if name.startswith("pooler/"):  # the loss does not read the pooler
      assert not np.any(flat_remat[name]) and not np.any(want), name
    else:
      assert _rel(flat_remat[name], want) < 1e-4, name
