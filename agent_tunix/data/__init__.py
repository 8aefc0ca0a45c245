"""Data: synthetic and GSM8K examples, prompt templates, grain pipelines.

synthetic (arithmetic word problems generated offline), gsm8k (GSM8K from
TFDS or Hugging Face, and question/answer rows of local JSONL or parquet
files), rubrics (rubric rows, every checklist shape made one), prompts (the
chat, few-shot and tool prompt templates) and pipeline (data.source ->
examples -> prompts -> checkpointable grain batches, with the train/eval
split; docs/data.md). A bottom layer: modules here import only each other, never another part of
agent_tunix.
"""
