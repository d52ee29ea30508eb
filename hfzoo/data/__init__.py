"""Data: loading local files and hub datasets, text cleaning, tokenization and packing."""
