"""hfzoo's task files for lm-evaluation-harness (`<task>.yaml`) and their local-data loaders (`tasks.py`)."""
