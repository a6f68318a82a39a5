#!/bin/sh
# Prints 1 when its argv is exactly: "a b", c"d, "e f", '' (the quoting test of script:CMD), else 0.
cat >/dev/null
if [ $# -eq 4 ] && [ "$1" = "a b" ] && [ "$2" = 'c"d' ] && [ "$3" = "e f" ] && [ -z "$4" ]; then
    echo 1
else
    echo "argv: $#: [$1] [$2] [$3] [$4]" >&2
    echo 0
fi
