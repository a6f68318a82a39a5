#!/bin/sh
# reads its row, prints something that is not a score
while read -r line; do :; done
echo "seven point five"
