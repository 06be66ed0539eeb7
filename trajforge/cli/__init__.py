"""The command line: the flag table, flags -> RunConfig, run.json's memory, --version, the command to go on."""
