"""The checks ``cortex-recipes validate`` (:mod:`cortex_recipes.validate`) runs, one module per
family."""
