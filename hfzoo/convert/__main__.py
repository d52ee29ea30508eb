"""`python -m hfzoo.convert --model_name_or_path SRC --output_dir DST`: the `hfzoo-convert` CLI."""

from .cli import main

main()
