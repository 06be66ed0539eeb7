"""One sample, start to end: the steps every kind of run keeps in the same order (sample.py), what acts
between setup and verification (actors.py), and the trajectory's line of a batch file (record.py)."""
