"""Run programs on a remote psych-sandbox service; serve a local profile as one."""
