#!/bin/sh
# dies of a signal
kill -SEGV $$
