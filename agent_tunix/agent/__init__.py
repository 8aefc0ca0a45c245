"""What a multi-turn rollout asks between the model's turns.

When a row's model turn ends, the decode loop (in `agent_tunix.rl`) hands the
turn's text to the row's environment (`environment`), which decides whether
the episode is over or which text to insert before the next turn. For tool
use, the environment reads the turn with a tool-call format (`formats`: how
one model family writes calls and reads results), runs the calls on host
threads with time and size limits (`executor`) against the configured tools
(`tools`, with the built-in exact `calculator`). Model output is only ever
parsed as data, never run as code. This is a bottom layer: its modules import
only the standard library, numpy, absl and each other (no jax, no other
agent_tunix package).
"""
