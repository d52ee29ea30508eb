"""Marks the GLUE metric module folder as package data (`evaluate.load` reads `glue.py` from here)."""
