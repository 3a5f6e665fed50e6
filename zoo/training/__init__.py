"""A training run: `train` (LightningCLI, `zoo train`), `recipe_args` (the recipe on the command
line), `runs` (run folders, resuming), `callbacks`, and `verbs` (validate, test, predict)."""
