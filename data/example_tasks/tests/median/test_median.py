import os
import sys

sys.path.insert(0, os.getcwd())  # the repository under test is the working directory
from textkit.stats import median

assert median([3, 1, 2]) == 2
assert median([4, 1, 3, 2]) == 2.5, median([4, 1, 3, 2])
assert median([5]) == 5
print("median: all tests passed")
