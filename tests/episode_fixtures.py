"""An environment for end-to-end tests of multi-turn episodes
('--config.agent.environment=episode_fixtures:ScriptedEnvironment').

The tiny random model never writes a tool call, so this environment makes
turns happen on its own: a sampled piece holding 'e' pauses the row, every
second pause of a turn completes it (`ends_turn`), the first two turns get
a fixed reply inserted and the third ends the episode. It depends on the
turns' texts only, so every process of a multi-host run inserts the same
tokens, and a resumed run repeats the uninterrupted one.
"""

from agent_tunix.agent import environment


class ScriptedEnvironment(environment.Environment):
  """Two replies, then the end (see the module docstring)."""

  pause_texts = ('e',)

  def reset(self, example):
    self.example = dict(example)
    self.turns = []
    self.pauses = 0

  def ends_turn(self, partial_text):
    self.pauses += 1
    return '<end_of_turn>' if self.pauses % 2 == 0 else None

  def step(self, turn_text):
    self.turns.append(turn_text)
    self.pauses = 0
    if len(self.turns) <= 2:
      reply = f'\n<start_of_turn>user\nreply {len(self.turns)}'
      return environment.Reply(
          text=reply + '<end_of_turn>\n<start_of_turn>model\n', done=False)
    return environment.Reply(text=None, done=True,
                             finish=environment.FINISH_ANSWER)

  @property
  def stats(self):
    return {'turns': len(self.turns), 'tool_calls': min(len(self.turns), 2)}

  @property
  def tool_calls(self):
    return [{'name': 'scripted', 'arguments': {}, 'result': t, 'error': None}
            for t in self.turns[:2]]
