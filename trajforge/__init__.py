"""The batch runner's machinery; `batch_runner.py` is its command line.

cli reads the flags (one table) into a RunConfig; run checks the dataset, plans and drives a run;
verification holds the tasks and what checks a finished sample; executors run prompts in worker
processes (or Ray tasks); agent holds the agent loop, model the client for the endpoint, tools and
environments what a prompt can do and where; runfolder keeps batch files, checkpoint and merge; mock is
the scripted model behind --model=mock and the tests.
"""
