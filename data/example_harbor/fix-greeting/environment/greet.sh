#!/bin/bash
echo "Goodbye, $1."
