"""One run per workdir: a program that writes a workdir (train, finetune, distill_task) holds its
lock for as long as it runs, so that a run started twice (a requeue, a typo in a launch script)
cannot interleave its checkpoints and metrics with the first.

The lock is `<workdir>/run.lock`, a small JSON file naming its holder (host, process id, program,
start time) and refreshed every `HEARTBEAT_S` seconds. Two ways keep a second program out:
- `fcntl.flock` on the file: on one host (and on shared file systems whose locks reach across
  hosts) the kernel refuses a second holder and frees the lock of a process that dies, `kill -9`
  included;
- the heartbeat, a lease for shared file systems whose locks do not reach across hosts: a record
  of another host refreshed within `STALE_AFTER_S` is a run in progress there.
A record left by a run that is no longer running (its lock free, its lease run out) is taken over
with a one-line notice. Several processes of one multi-host run share the workdir: process 0 holds
the lock for them all (`training.loop.begin_run`).
"""

import atexit
import contextlib
import datetime
import fcntl
import functools
import json
import logging
import os
import socket
import sys
import threading
import time

from minilm_jax.errors import UserError

LOCK_FILE = "run.lock"
HEARTBEAT_S = 30.0
STALE_AFTER_S = 4 * HEARTBEAT_S

_HELD: dict = {}  # realpath of a workdir -> its _Lock, held by this process


class _Lock:
  def __init__(self, workdir: str, fd: int, record: dict, created: bool):
    self.workdir, self.fd, self.record, self.created = workdir, fd, record, created
    self.path = os.path.join(workdir, LOCK_FILE)
    self.stopped = threading.Event()
    self._write()
    self.heartbeat = threading.Thread(target=self._beat, name=f"lock heartbeat {workdir}", daemon=True)
    self.heartbeat.start()

  def _write(self):
    self.record["heartbeat"] = time.time()
    data = (json.dumps(self.record) + "\n").encode()
    os.lseek(self.fd, 0, os.SEEK_SET)
    os.ftruncate(self.fd, 0)
    os.write(self.fd, data)

  def _beat(self):
    while not self.stopped.wait(HEARTBEAT_S):
      try:
        self._write()
      except OSError:  # a full disk: the flock still holds; the lease is only for other hosts
        pass

  def release(self):
    self.stopped.set()
    try:
      if os.path.exists(self.path) and os.stat(self.path).st_ino == os.fstat(self.fd).st_ino:
        os.remove(self.path)  # while still locked: a program waiting on this file then retries the new one
    except OSError:
      pass
    fcntl.flock(self.fd, fcntl.LOCK_UN)
    os.close(self.fd)
    if self.created:  # a run refused before it wrote anything leaves no workdir behind
      with contextlib.suppress(OSError):
        os.rmdir(self.workdir)


def _read(fd: int) -> dict | None:
  """The lock file's record; {} for an empty file (just created), None for one no run of ours wrote."""
  os.lseek(fd, 0, os.SEEK_SET)
  try:
    record = json.loads(os.read(fd, 65536) or b"{}")
  except ValueError:
    return None
  return record if isinstance(record, dict) else None


def _running_elsewhere(record: dict | None) -> bool:
  """Whether `record` is another host's run whose lease is fresh (on a file system whose locks do
  not reach across hosts, the lease is all that says it runs)."""
  if not record:
    return False
  return record.get("host") != socket.gethostname() and time.time() - record.get("heartbeat", 0) < STALE_AFTER_S


def holder(workdir: str) -> dict | None:
  """The record of the program that holds `workdir` now (another process's, or another host's
  whose lease is fresh), or None: what a reader of the run (a teacher read by a student) checks."""
  path = os.path.join(workdir, LOCK_FILE)
  if os.path.realpath(workdir) in _HELD or not os.path.isfile(path):
    return None
  fd = os.open(path, os.O_RDONLY)
  try:
    try:
      fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
      return _read(fd) or {}
    fcntl.flock(fd, fcntl.LOCK_UN)
    record = _read(fd)
    return record if _running_elsewhere(record) else None
  finally:
    os.close(fd)


def describe(record: dict) -> str:
  """`record`'s holder in words: program, process id, host, start time."""
  started = datetime.datetime.fromtimestamp(record.get("started", 0)).isoformat(sep=" ", timespec="seconds")
  return f"{record.get('program', '?')} (pid {record.get('pid', '?')} on {record.get('host', '?')}, started {started})"


def _program() -> str:
  return os.path.splitext(os.path.basename(sys.argv[0]))[0] if sys.argv and sys.argv[0] else "python"


def hold(workdir: str):
  """Holds `workdir`'s lock for this process until `release(workdir)` or the process ends (held
  already: nothing to do). A workdir another program holds is one line naming it."""
  key = os.path.realpath(workdir)
  if key in _HELD:
    return
  created = not os.path.isdir(workdir)
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, LOCK_FILE)
  while True:
    try:
      fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except IsADirectoryError:
      raise UserError(
        f"--workdir {workdir}: its {LOCK_FILE} is a directory, not a lock a run wrote: remove it "
        f"(rm -r {path}) if no run uses it, or give this run another --workdir"
      ) from None
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      running = _read(fd) or {}
      os.close(fd)
      raise UserError(_in_use(workdir, running)) from None
    try:
      if os.stat(path).st_ino == os.fstat(fd).st_ino:
        break  # the file at `path`, not one its holder removed as we opened it
    except FileNotFoundError:
      pass
    os.close(fd)
  earlier = _read(fd)
  if earlier and _running_elsewhere(earlier):
    os.close(fd)  # another host's run, on a file system whose locks do not reach across hosts
    raise UserError(_in_use(workdir, earlier))
  if earlier is None:
    logging.warning("--workdir %s: taking over %s, which holds no record a run wrote (no run holds it)", workdir, path)
  elif earlier:
    logging.warning("--workdir %s: taking over the lock of %s, which is no longer running", workdir, describe(earlier))
  record = {"host": socket.gethostname(), "pid": os.getpid(), "program": _program(), "started": time.time()}
  _HELD[key] = _Lock(workdir, fd, record, created)


def _in_use(workdir: str, holder: dict) -> str:
  return (
    f"--workdir {workdir} is in use by {describe(holder)}: wait for it to end (or stop it), "
    f"or give this run another --workdir"
  )


def release(workdir: str):
  """Lets `workdir` go, if this process holds it."""
  lock = _HELD.pop(os.path.realpath(workdir), None)
  if lock is not None:
    lock.release()


def released_on_error(build):
  """A run builder `build(config, workdir, ...)` that lets the workdir go when it fails: a run refused
  while it is built (bad input found after `begin_run`) leaves the workdir free, and none behind
  when it made it."""

  @functools.wraps(build)
  def wrapper(*args, **kwargs):  # (config, workdir, ...): the config only passes through
    try:
      return build(*args, **kwargs)
    except BaseException:
      release(kwargs["workdir"] if "workdir" in kwargs else args[1])
      raise

  return wrapper


def release_all():
  for key in list(_HELD):
    _HELD.pop(key).release()


atexit.register(release_all)
