#!/usr/bin/env bash
# Session 56's first call: the bar's table (s51a), then s55e (racecheck at two ranks, the staged rows).
set -uo pipefail
ROUNDS="1 2 3" bash .device/s51a.sh; cp $OUT/all.tgz $OUT/bar.tgz
bash .device/s55e.sh
