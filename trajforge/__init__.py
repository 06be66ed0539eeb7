"""The batch runner's machinery; `batch_runner.py` is its command line.

config and dataset check the input; runner plans and drives a run; executors run prompts in worker
processes (or Ray tasks); agent holds the agent loop, model the client for the endpoint, tools and
environments what a prompt can do and where; runfolder keeps batch files, checkpoint and merge; mock is
the scripted model behind --model=mock and the tests.
"""
