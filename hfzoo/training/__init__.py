"""The training core shared by the recipes, and the recipes' entry points.

Shared core: `objectives` (the pretraining objective registry: clm | mlm | span), `accelerator`
(`create_accelerator`), `optimization` (AdamW parameter groups without weight decay on vectors,
scalars and norms; the learning-rate schedule), `arguments`, `evaluation`, `plots`, `peft_utils`,
`runtime`. Recipes: `pretraining` (with `streaming` for `--streaming`), `glue` (with `glue_loop`,
`glue_outputs` and `glue_sweep`), `train_tokenizer`, `consolidate`. Importing `hfzoo` does not import
this package (it needs the `train` extra).
"""
