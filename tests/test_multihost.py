"""Several processes on loopback through launch/local.sh: the multi-host code path of a pod, on one machine."""

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import datasets
import numpy as np
import pytest
from flax import traverse_util

from conftest import COMPILE_FLAGS, ROOT, read_metrics, run_in_process, train_command
from minilm_jax import runs
from minilm_jax.data.corpus import BatchStream, stack_columns

LAUNCH = os.path.join(ROOT, "launch")
STEPS = ["--config.num_steps=20", "--config.checkpoint.every=5"]


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _env(tiny_teacher, tiny_corpus):
  env = dict(os.environ, TINY_TEACHER=tiny_teacher, TINY_CORPUS=tiny_corpus, PYTHONPATH=os.path.join(ROOT, "tests"))
  env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]  # the launcher runs `python`
  env["XLA_FLAGS"] = COMPILE_FLAGS  # the launcher adds the device count
  return env


def _launch(settings, workdir, env, *overrides, background=False):
  cmd = [
    "bash",
    os.path.join(LAUNCH, "local.sh"),
    *settings,
    "--config",
    os.path.join(ROOT, "tests", "tiny_config.py") + ":evaluators",
    "--workdir",
    workdir,
    *STEPS,
    *overrides,
  ]
  if background:
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def _flat_params(workdir):
  return traverse_util.flatten_dict(runs.read_run(workdir).params, sep="/")


def _losses(workdir):
  return [r["loss"] for r in read_metrics(workdir) if "loss" in r]


def _assert_same_run(a, b):
  np.testing.assert_allclose(_losses(b), _losses(a), rtol=1e-5)
  pa, pb = _flat_params(a), _flat_params(b)
  # The key bias has a zero exact gradient: Adam-amplified rounding noise (test_train). Elsewhere,
  # Adam's steps turn the other reduction order of gloo's all-reduce into differences (up to 2e-5
  # over 30 steps) on entries whose gradient is near 0 (Adam divides it by its own magnitude), 2% of
  # one lr-sized step.
  for name in pa:
    if not name.endswith("attention/key/bias"):
      np.testing.assert_allclose(pb[name], pa[name], atol=5e-5, rtol=1e-5, err_msg=name)


def _one_process_run(tiny_teacher, tiny_corpus, workdir, capfd, monkeypatch):
  """The reference: the launcher's command as one process of 8 devices, run in this process (the
  test's processes are the two it starts)."""
  monkeypatch.setenv("TINY_TEACHER", tiny_teacher)
  monkeypatch.setenv("TINY_CORPUS", tiny_corpus)
  config = os.path.join(ROOT, "tests", "tiny_config.py") + ":evaluators"
  proc = run_in_process("train", "--config", config, "--workdir", workdir, *STEPS, capfd=capfd, devices=8)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return workdir


def test_each_process_reads_a_disjoint_slice_of_every_global_batch():
  rows = datasets.Dataset.from_dict({"input_ids": [[i] for i in range(40)]})
  streams = [BatchStream(rows, 8, 0, stack_columns, p, 2) for p in range(2)]
  for b in range(10):
    parts = [s.batch(b)["input_ids"].ravel() for s in streams]
    assert not set(parts[0]) & set(parts[1])
    np.testing.assert_array_equal(
      np.concatenate(parts), BatchStream(rows, 8, 0, stack_columns).batch(b)["input_ids"].ravel()
    )


@pytest.mark.slow
def test_two_processes_of_four_devices_killed_and_restarted_equal_one_process_of_eight(
  tiny_teacher, tiny_corpus, tmp_path, capfd, monkeypatch
):
  """Two processes of 4 devices each: one is killed after the first checkpoint (the launcher stops
  the other and fails), both restart and resume, and the run ends as one process of 8 devices
  ends: the same losses and parameters, each step logged once by process 0, and the evaluators'
  scores (each process embedding its share of the sentences) at every evaluated step. One run for
  both properties: a separate unstopped two-process run cost the suite another 35 s of CPU."""
  env = _env(tiny_teacher, tiny_corpus)
  workdir = str(tmp_path / "killed")
  settings = ["NUM_PROCESSES=2", "CPU_DEVICES=4", f"PORT={_free_port()}"]
  launcher = _launch(settings, workdir, env, background=True)
  deadline = time.time() + 300
  done = lambda: (
    os.path.isdir(os.path.join(workdir, "checkpoints"))
    and any(name.isdigit() for name in os.listdir(os.path.join(workdir, "checkpoints")))
  )  # finalised, not *-tmp
  while not done():
    assert launcher.poll() is None and time.time() < deadline, (
      launcher.stderr.read()[-3000:] if launcher.poll() else "timeout"
    )
    time.sleep(0.1)
  children = subprocess.run(["pgrep", "-P", str(launcher.pid)], capture_output=True, text=True).stdout.split()
  assert len(children) == 2
  os.kill(int(children[1]), signal.SIGKILL)
  _, err = launcher.communicate(timeout=120)
  assert launcher.returncode == 1 and "a process of the run failed" in err
  interrupted = runs.RunCheckpoints(workdir, read_only=True).latest_step()
  assert interrupted is not None  # Orbax also keeps step 1, whatever the interval
  assert interrupted < 20, "the run ended before it was killed"

  # Restart all: the run continues from the last complete checkpoint and ends as if never stopped.
  proc = _launch(settings[:2] + [f"PORT={_free_port()}"], workdir, env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert [r["step"] for r in read_metrics(workdir)] == list(range(0, 21))  # one writer: process 0
  one_process_run = _one_process_run(tiny_teacher, tiny_corpus, str(tmp_path / "one_process"), capfd, monkeypatch)
  _assert_same_run(one_process_run, workdir)
  # The evaluators (a held-out loss, WordNet retrieval; at steps 0, 10 and 20) score the same when
  # the two processes each embed their share of the sentences.
  scores = lambda run: {(r["step"], k): v for r in read_metrics(run) for k, v in r.items() if k.startswith("eval/")}
  one, two = scores(one_process_run), scores(workdir)
  # The restarted run scores the (unchanged) teacher again at its first evaluation, as every run start does.
  rescored = {key: value for key, value in two.items() if key not in one}
  assert rescored and {(step, "/teacher/" in name) for step, name in rescored} == {(10, True)}, rescored
  for (_, name), value in rescored.items():
    assert value == pytest.approx(one[(0, name)], rel=1e-4, abs=1e-5), name
  assert one.keys() <= two.keys() and {step for step, _ in one} == {0, 10, 20}
  assert {k for _, k in one} >= {"eval/heldout/loss", "eval/wordnet/recall@10", "eval/wordnet/mrr@10"}
  for key in one:
    assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-5), key


def _one_process_of_two(tiny_teacher, tiny_corpus, workdir, index, port, *overrides, timeout="60"):
  env = _env(tiny_teacher, tiny_corpus)
  env.update(
    MINILM_DISTRIBUTED="1",
    MINILM_COORDINATOR=f"127.0.0.1:{port}",
    MINILM_NUM_PROCESSES="2",
    MINILM_PROCESS_ID=str(index),
    MINILM_INIT_TIMEOUT=timeout,
    JAX_PLATFORMS="cpu",
    JAX_NUM_CPU_DEVICES="2",
  )
  return subprocess.Popen(
    train_command(workdir, *overrides), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
  )


def test_processes_that_disagree_on_the_config_stop_with_one_line(tiny_teacher, tiny_corpus, tmp_path):
  port = _free_port()
  procs = [
    _one_process_of_two(tiny_teacher, tiny_corpus, str(tmp_path / "w"), i, port, f"--config.optimizer.lr={lr}")
    for i, lr in enumerate((1e-3, 2e-3))
  ]
  for proc in procs:
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 2, err[-2000:]
    lines = [l for l in err.splitlines() if l.startswith("error:")]
    assert len(lines) == 1 and "disagree on the config" in lines[0]
  assert not os.path.exists(tmp_path / "w" / "checkpoints")


@pytest.mark.slow
def test_unreachable_coordinator_is_a_bounded_wait_then_one_line(tiny_teacher, tiny_corpus, tmp_path):
  start = time.time()
  proc = _one_process_of_two(tiny_teacher, tiny_corpus, str(tmp_path / "w"), 1, _free_port(), timeout="5")
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 2 and time.time() - start < 90
  lines = [l for l in err.splitlines() if l.startswith("error:")]
  assert len(lines) == 1 and "could not join the distributed run" in lines[0]


def test_a_coordinator_port_already_taken_is_one_line(tiny_teacher, tiny_corpus, tmp_path):
  """Process 0 would serve the coordinator on a port another program listens on: the runtime
  crashed with a segmentation fault; it is one line naming the address and what to do."""
  with socket.socket() as taken:
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    proc = _one_process_of_two(tiny_teacher, tiny_corpus, str(tmp_path / "w"), 0, port, timeout="5")
    _, err = proc.communicate(timeout=120)
  assert proc.returncode == 2, err[-2000:]
  lines = [l for l in err.splitlines() if l.startswith("error:")]
  assert len(lines) == 1 and f"the coordinator's address 127.0.0.1:{port} is taken" in lines[0], err[-2000:]
  assert "PORT=" in lines[0] and not os.path.exists(tmp_path / "w")


def test_launch_scripts_pass_bash_n_and_shellcheck():
  scripts = sorted(glob.glob(os.path.join(LAUNCH, "*")))
  assert {os.path.basename(s) for s in scripts} >= {"local.sh", "tpu_pod.sh", "slurm_gpu.sbatch", "common.sh"}
  for script in scripts:
    subprocess.run(["bash", "-n", script], check=True)
  if shutil.which("shellcheck"):  # .ci/run installs it from Debian's packages
    proc = subprocess.run(["shellcheck", "-x", *scripts], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout
