"""A judge's answer about one completion: `Verdict`."""

import dataclasses
import time

from agent_tunix.judge import prompts

FAILURE_KINDS = ('timeout', 'http', 'connection', 'unparseable')


@dataclasses.dataclass
class Verdict:
  """The judge's answer about one completion.

  Attributes:
    score: the reward in [-1, 1] (explicit) or [0, 1] (implicit); None on
      failure.
    met: per item, whether it holds (explicit; None otherwise).
    failure: None, or one of FAILURE_KINDS.
    detail: what failed (status, first 200 characters of the reply, ...).
    latency_s: wall time of the call, retries included.
    retries: unparseable replies asked again (transport retries are the
      client's and counted from its requests).
  """

  score: float | None
  met: list[bool] | None = None
  failure: str | None = None
  detail: str = ''
  latency_s: float = 0.0
  retries: int = 0


def failed(kind, detail, start, retries=0):
  return Verdict(None, failure=kind, detail=detail,
                 latency_s=time.perf_counter() - start, retries=retries)


def read(task, reply, aggregation, start, retries=0):
  """A Verdict from a reply (raises prompts.Unparseable)."""
  if aggregation == 'explicit':
    met = prompts.parse_verdicts(reply, len(task['items']))
    score = prompts.explicit_score(task['items'], met)
  else:
    met = None
    score = prompts.implicit_score(prompts.parse_rating(reply))
  return Verdict(score, met=met, latency_s=time.perf_counter() - start,
                 retries=retries)
