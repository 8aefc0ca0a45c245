"""The machine description a run logs at every start (observe/machine.py)."""

from agent_tunix.observe import machine

# Two processors' blocks, as /proc/cpuinfo prints them (shortened).
_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7B13
flags\t\t: fpu sse2 avx fma avx2 bmi2

processor\t: 1
model name\t: another model
flags\t\t: avx512f amx_tile
"""


def test_parse_reads_the_first_processor():
  model, isa = machine.parse_cpuinfo(_CPUINFO)
  assert model == 'AMD EPYC 7B13'
  assert isa == ['avx2', 'fma']  # In ISA_FLAGS' order; avx512f is cpu 1's.


def test_parse_without_fields():
  assert machine.parse_cpuinfo('') == ('', [])
  assert machine.parse_cpuinfo('processor\t: 0\nFeatures\t: fp asimd\n') == (
      '', [])


def test_describe_from_a_file_and_without_one(tmp_path):
  path = tmp_path / 'cpuinfo'
  path.write_text(_CPUINFO)
  info = machine.describe(str(path))
  assert info['cpu_model'] == 'AMD EPYC 7B13'
  assert info['cpu_isa'] == ['avx2', 'fma']
  assert info['backend'] == 'cpu' and info['device_count'] >= 1
  assert info['usable_cpus'] >= 1
  line = machine.summary(info)
  assert 'CPU AMD EPYC 7B13' in line and 'ISA: avx2 fma' in line
  missing = machine.describe(str(tmp_path / 'absent'))
  assert missing['cpu_isa'] == [] and isinstance(missing['cpu_model'], str)
  assert 'ISA: none of avx2/' in machine.summary(missing)
