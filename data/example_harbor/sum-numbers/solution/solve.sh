#!/bin/bash
python3 -c "print(sum(int(x) for x in open('numbers.txt').read().split()))" > sum.txt
