"""One training run's life: the loop and what keeps it alive and honest.

train (the loop: mesh -> models -> data -> restore -> step, eval and
checkpoint hooks; no math), checkpoint (Orbax save/restore, exact resume),
preemption (SIGTERM and Ctrl-C as a flag the loop polls, and the save of the
last step when a step fails), lock (one run per workdir), resolved_config
(the config a workdir was started with, and the refusal of an unsafe change
on resume), schedule (the learning-rate schedule's span, kept across
resumes), judging (the run's reward set, built with its judge),
divergence, full_disk, alarms, errors (the one-line messages a command
prints), preview (`main --print_prompts`: the first training prompts and
their token counts, with the tokenizer only) and log_mirror (a worker's log file copied to the workdir as the
run goes). Modules here may import each other and every layer below
(observe, config, rl, data, models, rewards, tpu); never a command.
"""
