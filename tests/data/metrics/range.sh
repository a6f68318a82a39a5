#!/bin/sh
# Prints a number outside [0, 1].
cat >/dev/null
echo 1.5
