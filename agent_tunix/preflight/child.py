"""The compile child: the programs compiled in a process the kernel may kill.

A compile can need more host RAM than the machine has; `compile_isolated`
compiles in a child process and reports a program whose compile the kernel
killed (SIGKILL) as a `compiler.Killed`, with the peak host RAM the child
reached. Imports tpu/ and the modules beside it.
"""

import os
import pickle
import signal
import subprocess
import sys
import time
import traceback

from absl import flags
from absl import logging

from agent_tunix.preflight import compiler
from agent_tunix.preflight import programs as programs_lib
from agent_tunix.tpu import sharding
from agent_tunix.tpu import topology as tpu_topology

# Compile children run this; argv[1] is the descriptor their events go to.
_CHILD = ('import sys; from agent_tunix.preflight import child; '
          'child.compile_child(int(sys.argv[1]))')
# Tests set it to a program's name: the compile child kills itself (SIGKILL)
# as that program's compile starts, as the kernel's OOM killer would.
KILL_AT_ENV = 'AGENT_TUNIX_PREFLIGHT_TEST_KILL_AT'
# The repository root (agent_tunix/preflight/child.py is three levels down).
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def compile_isolated(config, topology, usable, programs=programs_lib.PROGRAMS,
                     keep_going=False):
  """`compile_programs` in a child process, which the kernel may kill.

  A program's compile can take more host RAM than the machine has; the
  kernel then kills the compiling process (SIGKILL) and all it printed was
  "Killed". Here that is the child: the program it was compiling comes
  back as a `compiler.Killed` with the peak host memory the child reached,
  the programs after it are skipped (or, with `keep_going`, compiled by a
  new child), and the report says so. The child builds the abstract model
  once and compiles the programs in turn, as `programs.compile_programs` in
  this process would, so the report is the same.

  Args:
    config: the run's config (validated).
    topology: the slice (a `tpu_topology.parse` name).
    usable: HBM bytes a program may use on one device.
    programs: the subset of PROGRAMS to compile.
    keep_going: go on after a program that does not fit or was killed.

  Returns:
    ([Program], [names of programs skipped], [tunix's Programs]).
  """
  todo = programs_lib.runs(config, programs)
  done, skipped, tunix = [], [], []
  while todo:
    compiled, more, killed, theirs = _compile_in_child(
        config, topology, usable, todo, keep_going)
    done += compiled
    skipped += more
    tunix += theirs
    if killed is None:
      break
    done.append(killed)
    order = programs_lib.PROGRAMS.index(killed.name)
    todo = [p for p in todo if programs_lib.PROGRAMS.index(p) > order]
    if killed.name == 'rollout_prefill' and 'rollout_decode' in todo:
      todo.remove('rollout_decode')  # It starts from the prefill's outputs.
      skipped.append('rollout_decode')
    if not keep_going:
      skipped += todo
      break
  return done, skipped, tunix


def _compile_in_child(config, topology, usable, programs, keep_going):
  """One compile child's ([Program], [skipped], `Killed` or None)."""
  read_fd, write_fd = os.pipe()
  env = dict(os.environ)
  env['PYTHONPATH'] = os.pathsep.join(
      [_ROOT] + ([env['PYTHONPATH']] if env.get('PYTHONPATH') else []))
  try:
    child = subprocess.Popen([sys.executable, '-c', _CHILD, str(write_fd)],
                             stdin=subprocess.PIPE, pass_fds=(write_fd,),
                             env=env)
  finally:
    os.close(write_fd)
  try:
    child.stdin.write(pickle.dumps((config, topology, usable, programs,
                                    keep_going, logging.get_verbosity())))
    child.stdin.close()
  except BrokenPipeError:
    pass  # It died first; its exit status tells.
  compiled, skipped, started, finished, error = [], [], None, False, ''
  tunix = []
  with os.fdopen(read_fd, 'rb') as events:
    while True:
      try:
        kind, *args = pickle.load(events)
      except (EOFError, pickle.UnpicklingError):
        break  # It is done or dead.
      if kind == 'start':
        started = (args, time.perf_counter())
      elif kind == 'program':
        compiled.append(args[0])
        started = None
      elif kind == 'skipped':
        skipped.append(args[0])
      elif kind == 'error':
        error = args[0]
      elif kind == 'tunix':
        tunix.extend(args[0])
      elif kind == 'done':
        finished = True
  _, status, usage = os.wait4(child.pid, 0)
  child.returncode = os.waitstatus_to_exitcode(status)
  if finished and child.returncode == 0:
    return compiled, skipped, None, tunix
  # ru_maxrss: kilobytes on Linux, bytes on macOS.
  peak = usage.ru_maxrss * (1 if sys.platform == 'darwin' else 1024)
  doing = f'compiling {started[0][0]}' if started else 'building the model'
  if child.returncode == -signal.SIGKILL:
    if not started:
      raise RuntimeError(
          f'The preflight\'s compile child was killed by the kernel '
          f'(SIGKILL) while {doing}, likely out of host memory, at '
          f'{compiler.gib(peak)} GiB of host RAM (peak resident); run it on '
          'a machine with more RAM.')
    (name, calls_per_step, arg_bytes, resident_bytes,
     function), start = started
    logging.warning('%s: the compile child was killed by the kernel at %s '
                    'GiB of host RAM.', name, compiler.gib(peak))
    killed = compiler.Killed(
        name=name, calls_per_step=calls_per_step, argument_bytes=arg_bytes,
        output_bytes=0, alias_bytes=0, temp_bytes=0, code_bytes=0,
        resident_bytes=int(resident_bytes), flops=0.0, bytes_accessed=0.0,
        compile_s=time.perf_counter() - start, function=function,
        error=(f'killed by the kernel (SIGKILL) while compiling, likely out '
               f'of host memory: the compiling process had reached '
               f'{compiler.gib(peak)} GiB of host RAM (peak resident)'),
        host_peak_bytes=peak)
    return compiled, skipped, killed, tunix
  how = (f'died of signal {signal.Signals(-child.returncode).name}'
         if child.returncode < 0 else f'exited with status {child.returncode}')
  raise RuntimeError(
      f'The preflight\'s compile child {how} while {doing}'
      + (f':\n{error}' if error else ' (its output is above).'))


def compile_child(events_fd):
  """A compile child's main: `compile_programs` on its parent's payload.

  The payload (config, topology, usable, programs, keep_going, absl
  verbosity) comes pickled on stdin; the events of `Compiler.listener`,
  then ('done',) or ('error', traceback), go pickled to `events_fd`.
  """
  (config, topology, usable, programs, keep_going,
   verbosity) = pickle.load(sys.stdin.buffer)
  flags.FLAGS(sys.argv[:1])
  logging.use_absl_handler()  # Logs to stderr as the command's own do.
  logging.set_verbosity(verbosity)
  kill_at = os.environ.get(KILL_AT_ENV)
  with os.fdopen(events_fd, 'wb') as out:

    def send(*event):
      pickle.dump(event, out)
      out.flush()
      if event[0] == 'start' and event[1] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)

    try:
      spec = tpu_topology.parse(topology)
      mesh = sharding.make_mesh(config.mesh,
                                devices=tpu_topology.devices(spec))
      programs_lib.compile_programs(config, mesh, usable, programs,
                                    keep_going, send)
    except Exception:  # pylint: disable=broad-exception-caught
      send('error', traceback.format_exc())  # The parent raises it.
      sys.exit(1)
    send('done')
