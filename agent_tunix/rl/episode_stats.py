"""Statistics of a batch of episodes: the agent/* metrics and the tool-use
bonus (`rl.episodes` samples the episodes)."""

import numpy as np

from agent_tunix.agent import environment
from agent_tunix.rl import episodes

# Per-row statistics of a batch of episodes (`row_stats`), gathered over
# processes and then reduced to scalars (`scalars`).
_FINISHES = (episodes.FINISH_ANSWER, episodes.FINISH_TURN_TOKENS,
             episodes.FINISH_COLUMNS,
             environment.FINISH_MAX_TOOL_CALLS, environment.FINISH_TIMEOUT)


def row_stats(batch):
  """{name: float array [rows]} of the `episodes.Episode`s in `batch` (see
  `scalars`)."""
  def stat(name):
    return np.array([float(e.stats.get(name, 0)) for e in batch],
                    np.float32)

  finish = np.array([e.finish for e in batch], object)
  rows = {
      'turns': np.array([e.turns for e in batch], np.float32),
      'model_tokens': np.array([e.model_tokens for e in batch],
                               np.float32),
      'tool_tokens': np.array([e.insert_tokens for e in batch],
                              np.float32),
      'calls': stat('tool_calls'),
      'parse_errors': stat('parse_errors'),
      'exec_errors': (stat('exec_errors') + stat('unknown_tool')
                      + stat('argument_errors')),
      'timeouts': stat('timeouts'),
      'excess_calls': stat('excess_calls'),
      'tool_seconds': stat('tool_seconds'),
      'injected_markers': stat('injected_markers'),
  }
  for name in _FINISHES:
    rows[f'finish_{name}'] = (finish == name).astype(np.float32)
  return rows


def scalars(rows):
  """The `agent/*` metrics of gathered `row_stats`.

  Per episode: turns, tool calls, the share that call a tool, model and
  tool (inserted) tokens, how episodes finished; per call attempt (calls
  run, unreadable call turns and calls over the per-turn cap): the parse,
  execution and timeout error rates; and the tool wall time of the batch.
  """
  attempts = rows['calls'] + rows['parse_errors'] + rows['excess_calls']
  per_attempt = lambda x: float(x.sum() / max(attempts.sum(), 1.0))
  out = {
      'agent/turns_mean': float(rows['turns'].mean()),
      'agent/turns_max': float(rows['turns'].max()),
      'agent/tool_calls_per_episode': float(rows['calls'].mean()),
      'agent/tool_use_rate': float((rows['calls'] > 0).mean()),
      'agent/parse_error_rate': per_attempt(rows['parse_errors']),
      'agent/exec_error_rate': per_attempt(rows['exec_errors']),
      'agent/timeout_rate': per_attempt(rows['timeouts']),
      'agent/model_tokens_mean': float(rows['model_tokens'].mean()),
      'agent/tool_tokens_mean': float(rows['tool_tokens'].mean()),
      'agent/injected_markers': float(rows['injected_markers'].sum()),
      'time/tool_s': float(rows['tool_seconds'].sum()),
  }
  for name in _FINISHES:
    out[f'agent/finish/{name}'] = float(rows[f'finish_{name}'].mean())
  return out


def tool_use_bonus(batch, amount):
  """float32 [rows]: `amount` for episodes with a call that ran cleanly."""
  return np.array(
      [amount if any(c.get('error') is None for c in e.tool_calls) else 0.0
       for e in batch], np.float32)
