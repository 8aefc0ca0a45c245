"""The presets: `get_config(arg=None)` modules, each built on base.py.

Every command takes one by name from any directory
(`--config=gemma3_270m:quick`) or, in a checkout, by path
(`--config=configs/gemma3_270m.py:quick`).

  base: every field with its default and a one-line reason.
  gemma3_270m: the offline default (the packaged Gemma 3 270M, synthetic
    arithmetic, one CPU); quick_test: a few short steps of it.
  gemma3_270m_tools: the 270M with a calculator, in multi-turn episodes.
  gemma3_270m_rubrics: the 270M on the shipped rubric rows (rubrics/),
    judged by its own base weights.
  gemma3_1b, gemma3_4b, gemma3_12b, gemma3_27b: Gemma 3 from Kaggle on GSM8K,
    for TPU slices.
  gemma4_e2b, gemma4_31b: Gemma 4 from Hugging Face on GSM8K, for TPUs.
  tiny, tiny_gemma4: small random models for tests and benchmarks.

This package imports nothing else of agent_tunix: every layer may read it.
"""
