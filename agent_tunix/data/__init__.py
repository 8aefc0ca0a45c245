"""Data: synthetic and GSM8K examples, prompt templates, grain pipelines."""
