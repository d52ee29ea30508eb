"""The accelerate training loop shared by the recipes, its arguments and evaluation."""
