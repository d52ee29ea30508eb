"""hfzoo: a Hugging Face-compatible Transformer model zoo and pretraining pipeline."""
