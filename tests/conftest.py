"""Test-wide settings, applied before jax is imported by any test module.

Tests run on CPU. XLA's backend optimisation level 0 roughly halves compile
time, which dominates this suite's tiny-model tests; it changes speed, not
results that the tests compare (every comparison is made within one run).
Subprocesses started by tests inherit these variables.
"""

import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
if '--xla_backend_optimization_level' not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = (
      os.environ.get('XLA_FLAGS', '') + ' --xla_backend_optimization_level=0'
  ).strip()
