"""Tasks as data and the verification of a finished sample: checks, the user's Python verifier, --check_tasks."""
