#!/bin/bash
# Open MPI launcher for the course's DDP entry point (chapter 11).
#   helpers/launchers/ddp_mpirun.sh HOSTFILE RANKS [entry point arguments ...]
#   e.g. helpers/launchers/ddp_mpirun.sh hosts 4 --dataset cifar10 --epochs 5
# HOSTFILE names the machines, one per line ("node01 slots=2"; lines starting with # are
# comments). Open MPI places the ranks on them in order (--map-by slot), so rank 0 runs on the
# first host: that host is MASTER_ADDR, where every rank meets (127.0.0.1 would name a different
# machine on every node). Every rank runs `python -m helpers.distributed`, which maps
# OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK to RANK / WORLD_SIZE / LOCAL_RANK and pins itself
# (--bind-to none). Run it from the course checkout, present at the same path on every host,
# with the course's environment active (or PYTHON=/path/to/python).
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 HOSTFILE RANKS [entry point arguments ...]" >&2
  exit 2
fi
hostfile=$1 np=$2
shift 2
first=$(awk '{sub(/#.*/, "")} NF {print $1; exit}' "$hostfile")
if [ -z "$first" ]; then
  echo "error: $hostfile names no host: write one machine per line, e.g. 'node01 slots=2'" >&2
  exit 2
fi
export MASTER_ADDR=${MASTER_ADDR:-$first}
export MASTER_PORT=${MASTER_PORT:-29500}
forward=(-x MASTER_ADDR -x MASTER_PORT -x PATH)
for var in PYTHONPATH COURSE_PROFILE COURSE_DATA COURSE_DATA_DIR OMP_NUM_THREADS TQDM_DISABLE; do
  if [ -n "${!var:-}" ]; then forward+=(-x "$var"); fi
done
root=()
if [ "$(id -u)" = 0 ]; then root=(--allow-run-as-root); fi  # Open MPI refuses root unless told
echo "MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT (rank 0 on the first host of $hostfile)"
exec mpirun "${root[@]}" --hostfile "$hostfile" --map-by slot --bind-to none -np "$np" "${forward[@]}" \
  "${PYTHON:-python}" -m helpers.distributed "$@"
