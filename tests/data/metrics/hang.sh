#!/bin/sh
# never answers
sleep 30
