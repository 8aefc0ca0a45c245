"""Data: synthetic and GSM8K examples, prompt templates, grain pipelines.

A bottom layer: modules here import only each other, never another part of
agent_tunix.
"""
