#!/bin/sh
# Prints nothing at all.
cat >/dev/null
