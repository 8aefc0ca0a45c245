"""What leaves a run as metrics: the CLU writer (TensorBoard, also on gs://),
the progress line, and the optional Weights & Biases writer.

Modules here may import agent_tunix.config (for ConfigError) and the layers
below it; never run or a command.
"""
