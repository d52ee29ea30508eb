"""Shared Transformer building blocks (imports only torch and transformers' model utilities)."""
