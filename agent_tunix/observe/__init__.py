"""What leaves a run as metrics: the CLU writer (TensorBoard, also on gs://),
the progress line, and the optional Weights & Biases writer.

metrics (the writer a run opens, hyperparameters, sample texts, progress
reports), writers (the MetricWriter interface and the writers that combine
others: log lines, a background thread, several at once), events
(TensorBoard event files written and read without TensorFlow) and
wandb_writer (W&B as one more writer, imported only when a project is set)
and machine (the CPU a run starts on, logged at every start).

Modules here may import agent_tunix.config (for ConfigError) and the layers
below it; never run or a command.
"""
