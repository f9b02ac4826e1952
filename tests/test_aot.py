"""`python -m minilm_jax.aot`: each program's own step compiled on this CPU host for a TPU slice and
for H100s (the `aot` extra: libtpu, jax's CUDA plugin, cuDNN), at tiny shapes; the report's numbers
against what the compiled program and the analytic count say; refusals in one line."""

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from conftest import ROOT, load_config_module, run_in_process
from minilm_jax.aot import programs, report, targets
from minilm_jax.devices.chips import GiB
from minilm_jax.errors import UserError
from minilm_jax.models import attention

# Its module fixture is built once: every test of this module runs on the same xdist worker.
pytestmark = [
  pytest.mark.xdist_group("aot"),
  pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None or importlib.util.find_spec("jax_cuda12_plugin") is None,
    reason='the aot extra is not installed: pip install -e ".[aot]" (CI installs it)',
  ),
]

# MiniLM's paper config (BERT-base teacher from the hub, which aot knows offline), shrunk: a 2x128
# teacher with 4 heads, a 2x64 student, length 64.
TINY_TRAIN = [
  "--config",
  os.path.join(ROOT, "configs", "minilm_6x384.py"),
  "--model_shape=2x128x4",
  "--config.student.num_layers=2",
  "--config.student.hidden_size=64",
  "--config.student.num_heads=4",
  "--config.student.intermediate_size=128",
  "--config.loss.num_relation_heads=4",
  "--config.data.max_seq_length=64",
  "--config.batch_size=16",
]


# One layer each: the refusal and the batch search depend on the step's memory, not its depth, and
# each H100 compile of it takes half the time.
ONE_LAYER = [
  *(a for a in TINY_TRAIN if not a.startswith(("--model_shape", "--config.student.num_layers"))),
  "--model_shape=1x128x4",
  "--config.student.num_layers=1",
]


def run_aot(*args, capfd, env=None):
  """`python -m minilm_jax.aot <args>` in this process, with `env` set: (exit status, stdout, stderr)."""
  with pytest.MonkeyPatch.context() as patch:
    for name, value in (env or {}).items():
      patch.setenv(name, value)
    proc = run_in_process("aot", *args, capfd=capfd)
  return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def train_reports(tmp_path_factory):
  """The tiny distillation step compiled for a v5e-8 slice on the command line, and for a host of 8
  H100s by the same program in this process."""
  out = {}
  for target, extra in (("v5e-8", ()), ("h100x8", ("--peak_buffers", "4"))):
    path = str(tmp_path_factory.mktemp("aot") / f"{target}.json")
    args = [*TINY_TRAIN, "--target", target, "--json", path, *extra]
    if target == "v5e-8":
      proc = subprocess.run([sys.executable, "-m", "minilm_jax.aot", *args], capture_output=True, text=True, cwd=ROOT)
    else:
      proc = run_in_process("aot", *args, capfd=None)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out[target] = (json.load(open(path)), proc.stdout)
  return out


REQUIRED_FIELDS = (
  "target",
  "program",
  "peak_bytes_per_device",
  "device_memory_bytes",
  "fits",
  "flops_per_step",
  "analytic_flops_per_step",
  "bytes_accessed_per_step",
  "attention_kernel",
  "tokens_per_step",
  "compile_s",
)


@pytest.mark.slow
def test_distillation_step_compiles_for_tpu_and_h100(train_reports):
  for target, (row, stdout) in train_reports.items():
    assert all(row.get(k) is not None for k in REQUIRED_FIELDS), row
    assert row["target"] == target and row["program"] == "train" and row["fits"]
    assert row["devices"] == 8 and row["mesh"] == {"data": 8, "model": 1}
    assert row["tokens_per_step"] == 16 * 64
    # The state (parameters + two Adam moments, replicated) is in the arguments and, donated, aliased by the outputs.
    assert row["alias_bytes_per_device"] > 0 and row["peak_bytes_per_device"] < row["device_memory_bytes"]
    # Data parallelism: the gradients are averaged across the 8 devices by an all-reduce.
    assert row["collective_bytes_per_device"].get("all-reduce", 0) > 0
    assert "(a bound, not a measurement)" in stdout and "fits" in stdout
    # The roofline: the longer of the FLOPs at the chip's peak and the bytes at its HBM bandwidth.
    per_device_flops, per_device_bytes = row["flops_per_step"] / 8, row["bytes_accessed_per_step"] / 8
    times = {"flops": per_device_flops / row["peak_flops_per_s"], "hbm": per_device_bytes / row["hbm_bytes_per_s"]}
    assert row["bound_by"] == max(times, key=times.get)
    assert row["step_time_bound_s"] == pytest.approx(max(times.values()))
    assert row["tokens_per_s_bound"] == pytest.approx(row["tokens_per_step"] / row["step_time_bound_s"])
    assert 0 < row["kernel_bytes_added"] < row["bytes_accessed_per_step"]
  tpu, gpu = train_reports["v5e-8"][0], train_reports["h100x8"][0]
  assert tpu["device_memory_bytes"] == 16 * GiB
  # In bfloat16 on H100s the teacher's attention runs in cuDNN's flash kernel (given lengths, not a
  # mask); the student's, with attention dropout, in our Pallas flash kernel (Triton), as the
  # relation KLs in theirs. A TPU runs our kernels for both models' attention (Mosaic).
  assert gpu["attention_kernel"] == "cudnn_flash + pallas_flash" and gpu["cudnn_attention_calls"] >= 1
  assert gpu["cudnn_attention_flops_added"] > 0 and gpu["pallas_kernel_flops_added"] > 0
  kernels = {"minilm_flash_fwd", "minilm_flash_bwd", "minilm_relation_kl_fwd", "minilm_relation_kl_bwd"}
  assert set(gpu["pallas_kernel_calls"]) == kernels and set(tpu["pallas_kernel_calls"]) == kernels
  # The teacher's first layer and the student's first (the last layers' attention is dead code).
  assert gpu["pallas_kernel_calls"]["minilm_flash_fwd"] == 1 and tpu["pallas_kernel_calls"]["minilm_flash_fwd"] == 2
  assert tpu["attention_kernel"] == "pallas_flash" and tpu["cudnn_attention_flops_added"] == 0
  assert gpu["kernel_bytes_added"] > 0 and tpu["kernel_bytes_added"] > 0


@pytest.mark.slow
def test_xla_flops_match_the_analytic_count_at_a_tiny_shape(train_reports):
  """The analytic count (matrix products of the layers the loss needs, the student's three times)
  leaves out embeddings, layer norms, softmax and the optimizer: XLA counts them, and at this tiny
  width they are a large share. So XLA's count must be above the analytic one, and not far above."""
  for row, _ in train_reports.values():
    assert 1.0 <= row["flops_over_analytic"] < 3.0, row["flops_over_analytic"]
  # The matrix products alone (the optimised HLO's dots, cuDNN's and our kernels' calls added) are
  # what the analytic count counts, the student's attention scores recomputed in the backward pass
  # included: close to it even at this width (the relation kernels' backward recomputes the logits).
  # On a TPU they are dilated convolutions where its compiler writes them so: then not counted.
  gpu, tpu = train_reports["h100x8"][0], train_reports["v5e-8"][0]
  assert 0.95 < gpu["matmul_flops_over_analytic"] < 1.15, gpu["matmul_flops_over_analytic"]
  assert gpu["matmul_flops_per_step"] < gpu["flops_per_step"]
  if tpu["matmul_flops_per_step"] is None:
    assert "not counted" in train_reports["v5e-8"][1]
  else:
    assert 0.95 < tpu["matmul_flops_over_analytic"] < 1.15, tpu["matmul_flops_over_analytic"]


@pytest.mark.slow
def test_what_is_live_at_the_peak_adds_up_to_the_peak(train_reports):
  """`--peak_buffers 4`: XLA's buffer assignment at the peak, by source, the four largest and the
  rest. Together they are most of the compiled peak, never more: the memory analysis's temporary
  allocation holds more than what is live at its peak (88 % of it is here, 97 % at the paper's shape)."""
  row, stdout = train_reports["h100x8"]
  rows = row["peak_buffers"]
  assert len(rows) == 5 and rows[-1]["source"].startswith("the other ")
  assert [r["bytes"] for r in rows[:4]] == sorted((r["bytes"] for r in rows[:4]), reverse=True)
  assert any(r["source"] == "arguments" for r in rows)
  assert 0.8 * row["peak_bytes_per_device"] <= sum(r["bytes"] for r in rows) <= row["peak_bytes_per_device"]
  assert "live at the peak, by source" in stdout


def test_live_ranges_are_grouped_by_source():
  live = """HloLiveRange (max 9):
  Live ranges at 7 (peak):
    p.1{}: 4096 bytes (cumulative: 4096 bytes)
    fusion.3{}: 1024 bytes (cumulative: 5120 bytes)
    fusion.4{0}: 2048 bytes (cumulative: 7168 bytes)
    dot.9{}: 512 bytes (cumulative: 7680 bytes)
  Stack trace breakdown for peak usage: 7 680 bytes
"""
  hlo = """
  %p.1 = f32[1024]{0} parameter(0)
  %fusion.3 = f32[256]{0} fusion(%p.1), kind=kLoop, metadata={op_name="jit(step)/Encoder/layer_0/mul"}
  %fusion.4 = (f32[512]{0}) fusion(%p.1), kind=kLoop, metadata={op_name="jit(step)/transpose(jvp(Encoder))/layer_5/mul"}
  ROOT %dot.9 = f32[128]{0} dot(%p.1, %p.1), metadata={op_name="jit(step)/Encoder/pooler/dot_general"}
  """
  assert report.peak_buffers(live, hlo, top=2) == [
    {"source": "arguments", "bytes": 4096, "buffers": 1},
    {"source": "Encoder/layer_N/mul", "bytes": 3072, "buffers": 2},  # a layer's forward and another's backward
    {"source": "the other source", "bytes": 512, "buffers": 1},
  ]
  assert report.peak_buffers("no peak here", hlo, top=3) == []
  rematerialised = "jit(step)/transpose(jvp(Encoder))/layer_4/attention/jvp(Encoder)/layer_4/attention/checkpoint/exp"
  assert report._source(rematerialised) == "Encoder/layer_N/attention/checkpoint/exp"


def test_matrix_products_are_counted_from_the_hlo():
  hlo = """
  %a = bf16[8,16]{1,0} parameter(0)
  %b = bf16[16,4]{1,0} parameter(1)
  %d = f32[8,4]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %x = bf16[2,10,3]{2,1,0} parameter(2)
  %c = bf16[2,10,5]{2,1,0} convolution(%x, %w), window={size=1}, dim_labels=0bf_io0->0bf
  """
  assert report.matmul_flops(hlo) == 2 * 8 * 4 * 16 + 2 * (2 * 10 * 5) * 3
  assert report.matmul_flops(hlo + "window={size=2x4 stride=1x3 lhs_dilate=2x4}") is None
  # XLA's TPU compiler writes a batched product as a convolution whose window spans 32 positions,
  # padded by 31 on each side, over an input of one: each output reads one tap, not 32.
  padded = """
  %g = bf16[384,384,1]{1,0,2} parameter(0)
  %w = bf16[32,512,384]{1,2,0} parameter(1)
  %t = bf16[32,512,384]{1,2,0} convolution(%g, %w), window={size=32 pad=31_31 rhs_reversal=1}, dim_labels=bf0_0oi->0fb
  """
  assert report.matmul_flops(padded) == 2 * (32 * 512 * 384) * 384


@pytest.mark.slow
def test_finetune_and_evaluate_compile(tmp_path, tiny_teacher, capfd):
  glue = os.path.join(ROOT, "configs", "finetune", "glue.py")
  common = ["--config", glue, f"--config.init={tiny_teacher}", "--config.max_seq_length=32"]
  path = str(tmp_path / "finetune.json")
  status, _, stderr = run_aot(*common, "--config.batch_size=8", "--target", "v4-8", "--json", path, capfd=capfd)
  assert status == 0, stderr[-3000:]
  row = json.load(open(path))
  assert row["program"] == "finetune" and row["devices"] == 4 and row["fits"] and row["tokens_per_step"] == 8 * 32
  path = str(tmp_path / "evaluate.json")
  status, _, stderr = run_aot(
    *common, "--config.eval_batch_size=16", "--program", "evaluate", "--target", "h100x1", "--json", path, capfd=capfd
  )
  assert status == 0, stderr[-3000:]
  row = json.load(open(path))
  # The tiny teacher's config asks for float32: cuDNN's kernel is for half precision, so XLA's.
  assert row["program"] == "evaluate" and row["devices"] == 1 and row["attention_kernel"] == "xla"
  assert row["tokens_per_step"] == 16 * 32 and row["global_batch"] == 16


@pytest.mark.slow
def test_oversized_batch_is_refused_in_one_line_and_find_batch_finds_one_that_fits(tmp_path, capfd):
  """On one H100 (a GPU compile does not check capacity: the program compares the compiled peak
  with the memory JAX would preallocate). A TPU compile near its capacity takes minutes on 2 cores;
  the TPU compiler's own refusal is read by `report.parse_hbm_oom` (test below)."""
  status, _, stderr = run_aot(*ONE_LAYER, "--config.batch_size=1048576", "--target", "h100x1", capfd=capfd)
  lines = stderr.strip().splitlines()
  assert status == 2 and len(lines) == 1, stderr[-3000:]
  assert lines[0].startswith("error: train needs ") and "h100x1's h100 has 59.74 GiB usable" in lines[0]
  assert "optimizer.accumulate_steps" in lines[0] and "batch_size" in lines[0]
  # A batch whose inputs alone pass the card: refused before compiling (the GPU compiler failed on
  # it with a 72-line internal error, a kernel launch of more blocks than the card allows).
  status, _, stderr = run_aot(*ONE_LAYER, "--config.batch_size=268435456", "--target", "h100x1", capfd=capfd)
  lines = stderr.strip().splitlines()
  assert status == 2 and len(lines) == 1, stderr[-3000:]
  assert lines[0].startswith("error: train needs at least 192.04 GiB per device at batch_size=268435456"), lines
  # With 2 % of the card usable (XLA_PYTHON_CLIENT_MEM_FRACTION, as JAX's allocator reads it):
  # from 2400 (one device: any batch), a few thousand fit.
  small = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.02"}
  path = str(tmp_path / "find.json")
  status, _, stderr = run_aot(
    *ONE_LAYER, "--config.batch_size=2400", "--target", "h100x1", "--find_batch", "--json", path, env=small, capfd=capfd
  )
  assert status == 0, stderr[-3000:]
  row = json.load(open(path))
  largest, usable = row["largest_global_batch"], row["usable_memory_bytes"]
  assert usable == pytest.approx(0.02 * row["device_memory_bytes"], rel=1e-3) and largest > 2400
  # Every batch compiled on the way, with its peak: the answer fits, one within an eighth above it
  # does not, and the line through the points found it in at most four compiles (the config's own
  # included; three from this start).
  searched = {int(b): peak for b, peak in row["searched_peak_bytes_per_device"].items()}
  assert searched[largest] <= usable and len(searched) <= 4, searched
  assert any(largest < b <= largest + max(8, largest // 8) and p > usable for b, p in searched.items()), searched


def test_the_gpu_compilers_failures_on_sizes_past_any_card_are_a_program_that_does_not_fit(monkeypatch):
  """Where a program's inputs fit but one of its products has more rows than the GPU compiler can
  tile: the refusal names the largest array of the compiler's message as the least it needs."""
  from minilm_jax.aot.compiling import DoesNotFit, compile_program

  message = "INTERNAL: Couldn't find output tile sizes that satisfy hlo: %dot.159 = bf16[17179869184,1152]{1,0} dot("

  class Lowered:
    def compile(self, compiler_options=None):
      raise jax.errors.JaxRuntimeError(message)

  step = types.SimpleNamespace(lower=lambda *args: Lowered())
  program = types.SimpleNamespace(step=step, args=(jax.ShapeDtypeStruct((4, 8), jnp.int32),))
  with pytest.raises(DoesNotFit) as refused:
    compile_program(program, targets.parse_target("h100x1"))
  assert refused.value.needed == 17179869184 * 1152 * 2 and refused.value.at_least
  message = "INTERNAL: Mosaic failed to compile"  # any other error is the compiler's own, raised as it is
  with pytest.raises(jax.errors.JaxRuntimeError):
    compile_program(program, targets.parse_target("h100x1"))


def test_unknown_target_and_wrong_program_are_one_line(tmp_path, capfd):
  status, _, stderr = run_aot(*TINY_TRAIN, "--target", "h100x1", "--json", str(tmp_path), capfd=capfd)
  assert status == 2 and stderr.count("\n") == 1 and f"--json {tmp_path} already exists" in stderr
  status, _, stderr = run_aot(*TINY_TRAIN, "--target", "v9-8", capfd=capfd)
  assert status == 2 and stderr.count("\n") == 1 and "unknown target 'v9-8'" in stderr and "h100x8" in stderr
  status, _, stderr = run_aot(*TINY_TRAIN, "--target", "v5e-8", "--program", "finetune", capfd=capfd)
  assert status == 2 and stderr.count("\n") == 1 and "--program finetune does not run a distillation config" in stderr


def test_target_names():
  assert targets.parse_target("v4-8").num_devices == 4 and targets.parse_target("v4-8").topology == "v4:2x2x1"
  assert targets.parse_target("v5p-8").topology == "v5:2x2x1"
  assert targets.parse_target("v5e-8").topology == "v5e:2x4" and targets.parse_target("v5e-8").num_devices == 8
  assert targets.parse_target("v6e-8").topology == "v6e:2x4"
  big = targets.parse_target("v5e-256x2")
  assert big.topology == "v5e:16x16" and big.num_slices == 2 and big.num_devices == 512
  assert targets.parse_target("h100x8x2").topology == "1x2x8" and targets.parse_target("h100x8x2").num_devices == 16
  for bad in ("v5e-3", "v4-7", "h100x9", "a100x8", ""):
    with pytest.raises(UserError, match="unknown target"):
      targets.parse_target(bad)


def test_a_new_chip_is_a_row_of_the_table(monkeypatch):
  """docs/architecture.md's "A new accelerator target": a row of `CHIPS` is all a chip of a known
  platform needs. Its names parse (slices, hosts, TensorCores counted as its row says), the help's
  examples list it, and a size it has no slice of is one line naming its forms."""
  v7x = dataclasses.replace(targets.CHIPS["v5p"], topology_prefix="v7x", memory_bytes=192 * GiB, examples=("v7x-8",))
  h100nvl = dataclasses.replace(targets.CHIPS["h100"], memory_bytes=94 * GiB, examples=("h100nvlx8",))
  monkeypatch.setitem(targets.CHIPS, "v7x", v7x)
  monkeypatch.setitem(targets.CHIPS, "h100nvl", h100nvl)
  pod = targets.parse_target("v7x-16x2")
  assert (pod.chip, pod.topology, pod.num_devices, pod.num_slices) == (v7x, "v7x:2x2x2", 16, 2)
  host = targets.parse_target("h100nvlx4x2")
  assert (host.chip, host.topology, host.num_devices) == (h100nvl, "1x2x4", 8)
  assert host.usable_memory_bytes < 94 * GiB  # the share JAX preallocates on a GPU
  assert {"v7x-8", "h100nvlx8", "v5e-256x2"} <= set(targets.examples())
  with pytest.raises(UserError, match=r"v7x-N\[x<slices>\] \(N TensorCores: 8, 16, 32.*h100nvlx<1-8>\[x<hosts>\]"):
    targets.parse_target("v7x-6")


@pytest.mark.parametrize("name", ["v5p-8", "v6e-8", "v5e-256", "h100x8x2"])
def test_every_named_target_has_devices(name):
  target = targets.parse_target(name)
  devices = targets.compile_devices(target)
  assert len(devices) == target.num_devices
  assert {d.platform for d in devices} == {"tpu" if name.startswith("v") else "gpu"}


def test_hub_teachers_of_the_paper_configs_are_known_offline():
  assert programs.pretrained_config("bert-base-uncased", "teacher.path").hidden_size == 768
  xlmr = programs.pretrained_config("xlm-roberta-base", "teacher.path")
  assert xlmr.vocab_size == 250002 and xlmr.position_offset == 2
  with pytest.raises(UserError, match="--model_shape"):
    programs.pretrained_config("some-org/unknown-model", "teacher.path")


def test_the_paper_seq2seq_configs_trace_with_a_hub_encoder_offline():
  """configs/finetune/cnndm.py as shipped (UniLM's masked targets) on its hub encoder, which aot
  reads without a tokenizer: the masked-target step traces with the stand-in special ids."""
  config = load_config_module(os.path.join(ROOT, "configs", "finetune", "cnndm.py")).get_config()
  assert config.seq2seq.mask_prob == 0.7
  config.init, config.mesh.data = "bert-base-uncased", 1
  config.batch_size, config.max_seq_length, config.seq2seq.target_length = 2, 24, 8
  program = programs.finetune(config, jax.devices()[:1], "2x32")
  program.step.trace(*program.args)


def test_largest_batch_search():
  """Against every capacity, for memory affine in the batch (and for a compiler that gives no
  figure when it refuses): the answer fits, and the next multiple an eighth above it does not."""
  for fixed, per_row, nan_above in ((0, 1, False), (3000, 7, False), (3000, 7, True), (10, 1000, False)):
    for capacity in (
      0,
      7 * per_row + fixed,
      8 * per_row + fixed,
      100 * per_row + fixed,
      4096 * per_row + fixed,
      50_000 * per_row + fixed,
    ):
      largest_fitting = (capacity - fixed) // per_row // 8 * 8 if capacity >= fixed else 0
      for start in (8, 64, 4096):
        calls = []

        def peak_at(batch, capacity=capacity, fixed=fixed, per_row=per_row, nan_above=nan_above, calls=calls):
          calls.append(batch)
          peak = fixed + per_row * batch
          return float("nan") if nan_above and peak > capacity else peak

        found = programs.largest_batch(peak_at, start, 8, capacity)
        case = (fixed, per_row, nan_above, capacity, start, found, calls)
        assert found % 8 == 0 and found <= largest_fitting, case
        assert largest_fitting - found <= max(8, found // 8), case
        assert len(calls) < (14 if nan_above else 8), case
  # With figures, an affine memory is found in a few compiles from far away: 4096 -> about 50,000.
  calls = []
  programs.largest_batch(lambda b: calls.append(b) or 3000 + 7 * b, 4096, 8, 3000 + 7 * 50_000)
  assert len(calls) <= 4, calls


def test_kernel_choice_follows_the_mesh_being_traced():
  """Inside `shard_map` over a TPU slice's or an H100's compile-only devices, the encoder sees
  those devices' platform, not the host's CPU; outside any mesh it sees the default backend."""
  seen = {}
  for name in ("v5e-8", "h100x1"):
    devices = targets.compile_devices(targets.parse_target(name))
    mesh = Mesh(np.asarray(devices), ("data",))

    def body(x, name=name):
      seen[name] = (attention.compute_platform(), attention.fused_attention_implementation(jnp.bfloat16, 64))
      return x

    jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("data"), out_specs=P("data"))).lower(
      jax.ShapeDtypeStruct((len(devices),), jnp.float32)
    )
  assert seen == {"v5e-8": ("tpu", "xla"), "h100x1": ("gpu", "cudnn")}
  assert attention.compute_platform() == "cpu"


def test_padding_as_lengths_equals_the_padding_mask():
  """cuDNN's kernel gets right padding as row lengths; jax's XLA kernel takes the same arguments,
  and on every real query row gives what our [B, Lk] mask gives."""
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.normal(size=(3, 7, 2, 8)), jnp.float32) for _ in range(3))
  lengths = jnp.asarray([7, 4, 1])
  mask = jnp.arange(7)[None, :] < lengths[:, None]
  by_mask = jax.nn.dot_product_attention(q, k, v, mask=mask[:, None, None, :], implementation="xla")
  by_lengths = jax.nn.dot_product_attention(
    q, k, v, query_seq_lengths=lengths, key_value_seq_lengths=lengths, implementation="xla"
  )
  real = np.asarray(mask)[:, :, None, None]
  np.testing.assert_allclose(np.where(real, by_lengths, 0), np.where(real, by_mask, 0), atol=1e-6)


def test_collectives_and_hbm_messages_are_read():
  hlo = """
  %all-reduce.1 = f32[128,64]{1,0} all-reduce(f32[128,64]{1,0} %p), replica_groups={}
  %ag-start = (bf16[4,8]{1,0}, bf16[32,8]{1,0}) all-gather-start(bf16[4,8]{1,0} %x)
  %ag-done = bf16[32,8]{1,0} all-gather-done((bf16[4,8]{1,0}, bf16[32,8]{1,0}) %ag-start)
  %t = (f32[2]{0}, s32[3]{0}) all-reduce(f32[2]{0} %a, s32[3]{0} %b)
  """
  assert report.collective_bytes(hlo) == {"all-reduce": 128 * 64 * 4 + 2 * 4 + 3 * 4, "all-gather": 32 * 8 * 2}
  oom = (
    "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory ... (27.68G) exceeds available HBM (15.75G)"
  )
  assert report.parse_hbm_oom(oom) == pytest.approx(27.68 * (1 << 30))
  # A batch no chip holds (2,097,152 x 512 on a v5e) is counted in terabytes.
  huge = "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries (6.77T) "
  huge += "exceeds available HBM (15.75G)."
  assert report.parse_hbm_oom(huge) == pytest.approx(6.77 * (1 << 40))
  call = (
    'custom_call_target="__cudnn$fmhaSoftmax", operand_layout_constraints={bf16[8,128,12,64]{3,2,1,0}, '
    'bf16[8,128,12,64]{3,2,1,0}}\n custom_call_target="__cudnn$fmhaSoftmaxBackward", '
    "operand_layout_constraints={bf16[8,128,12,64]{3,2,1,0}}"
  )
  assert report.cudnn_attention_flops(call) == pytest.approx(14 * 8 * 12 * 128 * 128 * 64)


def test_kernel_calls_count_their_operands_results_and_products():
  """Custom calls that XLA's cost models count as nothing: one of our Pallas kernels (operand
  shapes from its layout constraints) and a cuBLAS product (operands by name, its workspace left
  out), each adding its operands read and results written once; the roofline takes the longer time."""
  hlo = (
    "  %a = bf16[8,64,16]{2,1,0} parameter(0)\n"
    "  %b = bf16[8,16,32]{2,1,0} parameter(1)\n"
    '  %pallas_call.1 = (bf16[2,128,4,32]{3,2,1,0}, f32[2,128,4,1]{3,2,1,0}) custom-call(%s, %m, %q, %k, %v), '
    'custom_call_target="__gpu$xla.gpu.triton", operand_layout_constraints={s32[1,1]{1,0}, s32[2,128,1]{2,1,0}, '
    "bf16[2,128,4,32]{3,2,1,0}, bf16[2,128,4,32]{3,2,1,0}, bf16[2,128,4,32]{3,2,1,0}}, "
    'metadata={op_name="jit(f)/minilm_flash_fwd/pallas_call"}\n'
    "  %custom-call.5 = (f32[8,64,32]{2,1,0}, s8[4194304]{0}) custom-call(%a, %b), "
    'custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"dot_dimension_numbers":'
    '{"lhs_contracting_dimensions":["2"],"rhs_contracting_dimensions":["1"]}}}\n'
  )
  flash, gemm = report.kernel_calls(hlo)
  qkv = 3 * 2 * 128 * 4 * 32 * 2
  assert flash["kernel"] == "minilm_flash_fwd" and flash["bytes"] == 4 + 2 * 128 * 4 + qkv + qkv // 3 + 2 * 128 * 4 * 4
  assert report.pallas_kernel_flops([flash]) == 2 * (2 * 2 * 4 * 128 * 128 * 32)
  assert gemm["kernel"] == "" and gemm["bytes"] == (8 * 64 * 16 + 8 * 16 * 32) * 2 + 8 * 64 * 32 * 4
  assert gemm["flops"] == 2 * 8 * 64 * 32 * 16
  chip = targets.CHIPS["h100"]
  assert report.roofline(1e12, 1e9, chip) == {"step_time_bound_s": 1e12 / chip.peak_bf16_flops, "bound_by": "flops"}
  assert report.roofline(1e12, 1e11, chip)["bound_by"] == "hbm"


@pytest.mark.slow
@pytest.mark.parametrize("teacher", ["tiny_deberta_teacher", "tiny_mpnet_teacher"])
def test_a_relative_teachers_step_keeps_the_fused_kernel_where_the_student_can_take_it(request, teacher):
  """The train step of a DeBERTa or MPNet teacher, traced for one H100: a BERT-shaped student's
  attention (with dropout) runs in our flash kernel; a student of the teacher's architecture,
  whose scores add relative-position terms the kernel does not take, on the explicit path. The
  teacher runs without dropout: XLA's attention, which takes the terms as a bias."""
  from conftest import tiny_config
  from minilm_jax.models import hf

  path = request.getfixturevalue(teacher)
  devices = targets.compile_devices(targets.parse_target("h100x1"))
  own = hf.read_config(path).model_type
  for model_type, flash in (("bert", True), (own, False)):
    overrides = {"student.model_type": model_type, "student.dropout": 0.1, "dtype": "bfloat16", "mesh.data": -1}
    overrides |= {"student.vocab_size": len(hf.load_tokenizer(path)), "data.max_seq_length": 64}
    overrides |= {"student.hidden_size": 64, "student.intermediate_size": 128}  # head size 16: the kernel's least
    program = programs.train(tiny_config(path, "demo", **overrides), devices)
    lowered = program.step.lower(*program.args).as_text()
    assert ("minilm_flash_fwd" in lowered) == flash, model_type
