"""The three model families and the named presets."""
