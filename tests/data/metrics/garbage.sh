#!/bin/sh
# Prints text that is not a score.
cat >/dev/null
echo "score: high"
