#!/bin/sh
# test_metrics' script metric: 1 when the answer (read from the JSON row on stdin) contains "yes", else 0.
if grep -q '"answer":"[^"]*yes'; then echo 1; else echo 0.25; fi
