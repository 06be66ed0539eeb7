"""One run: the dataset, the plan of samples, the helper processes, the run itself, its progress and advice."""
