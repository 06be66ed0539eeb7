import os
import sys

sys.path.insert(0, os.getcwd())
from textkit.slug import slugify

assert slugify("Hello, World!") == "hello-world", slugify("Hello, World!")
assert slugify("  many   spaces ") == "many-spaces"
print("slugify: all tests passed")
