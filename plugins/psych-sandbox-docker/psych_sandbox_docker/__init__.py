"""Docker backend plugin for psych-sandbox (infrastructure layer)."""
