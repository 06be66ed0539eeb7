#!/bin/bash
# The name comes from task.toml's [verifier] env.
got=$(bash /app/greet.sh "$GREETING_NAME")
echo "greet.sh $GREETING_NAME printed: $got"
if [ "$got" = "Hello, $GREETING_NAME!" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
