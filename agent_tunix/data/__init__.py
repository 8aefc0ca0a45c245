"""Data: synthetic and GSM8K examples, prompt templates, grain pipelines.

synthetic (arithmetic word problems generated offline), gsm8k (GSM8K from
Hugging Face or TFDS, and question/answer rows of local JSONL or parquet
files), rubrics (rubric rows, every checklist shape made one), few_shot (the
worked examples of the plain prompt, data.few_shot), prompts (the chat,
few-shot and tool prompt templates), pipeline (data.source -> examples ->
prompts -> checkpointable grain batches, with the train/eval split;
docs/data.md) and opening (a command's data opened before any model
loads; it also imports agent_tunix.cli for the one-line exit). A bottom layer: modules here import only each other, never another part of
agent_tunix.
"""
