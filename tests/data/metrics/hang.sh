#!/bin/sh
# Never finishes (a child sleeps): the timeout must kill the whole process group.
sleep 300
echo 1
