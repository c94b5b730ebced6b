#!/usr/bin/env bash
# `make server` / `make server-stop`: Prefect server (SQLite) + the `teamrl-process` work pool + every
# deployment of prefect.yaml + one worker, and the MLflow UI on the run store, all on 127.0.0.1.
# Each process runs in its own session; its process-group id is kept in .server/<name>.pid, so `stop`
# ends exactly those processes (and the flow runs the worker started), nothing else.
#   infra/server.sh start | stop | status   (env: PREFECT_PORT, MLFLOW_PORT, RUNS, VENV, SERVER_STATE)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
VENV=${VENV:-.venv}
STATE=${SERVER_STATE:-$ROOT/.server}     # pid files, logs and the Prefect database
PREFECT_PORT=${PREFECT_PORT:-4200}
MLFLOW_PORT=${MLFLOW_PORT:-5000}
RUNS=$(cd "$ROOT" && mkdir -p "${RUNS:-runs}" && cd "${RUNS:-runs}" && pwd)  # the run store the MLflow UI reads
export PREFECT_HOME=$STATE/prefect          # the server's SQLite database and settings live here
export PREFECT_API_URL=http://127.0.0.1:$PREFECT_PORT/api
export PREFECT_UI_URL=http://127.0.0.1:$PREFECT_PORT
export TEAMRL_HOME=$ROOT                    # prefect.yaml's pull step: flow runs start in this checkout
export TEAMRL_MLFLOW_UI=http://127.0.0.1:$MLFLOW_PORT
export HF_HUB_OFFLINE=1

alive() { [ -f "$STATE/$1.pid" ] && kill -0 -- "-$(cat "$STATE/$1.pid")" 2>/dev/null; }

launch() {  # launch NAME COMMAND...: in a new session, logging to .server/NAME.log
  local name=$1; shift
  if alive "$name"; then echo "$name already running (pid $(cat "$STATE/$name.pid"))"; return; fi
  setsid "$@" >"$STATE/$name.log" 2>&1 < /dev/null &
  echo $! >"$STATE/$name.pid"
}

wait_http() {  # wait_http URL NAME: up to 120 s
  for _ in $(seq 120); do
    "$VENV/bin/python" -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=2)" "$1" \
      2>/dev/null && return 0
    sleep 1
  done
  echo "error: $2 did not answer at $1; see $STATE/$2.log" >&2
  tail -20 "$STATE/$2.log" >&2
  return 1
}

start() {
  mkdir -p "$STATE"
  # every library's usage reporting off, unless the caller set its variable (infra/telemetry.py)
  while IFS='=' read -r name value; do export "$name=${!name-$value}"; done < <("$VENV/bin/python" -m infra.telemetry)
  launch prefect-server "$VENV/bin/prefect" server start --host 127.0.0.1 --port "$PREFECT_PORT"
  wait_http "$PREFECT_API_URL/health" prefect-server
  "$VENV/bin/python" -m flows.deployments --create-pool  # not `prefect work-pool create`: see create_pool
  "$VENV/bin/prefect" --no-prompt deploy --all >"$STATE/deploy.log" 2>&1 \
    || { echo "error: prefect deploy failed; see $STATE/deploy.log" >&2; tail -20 "$STATE/deploy.log" >&2; exit 1; }
  launch prefect-worker "$VENV/bin/prefect" worker start --pool teamrl-process --type process
  launch mlflow-ui "$VENV/bin/mlflow" ui --host 127.0.0.1 --port "$MLFLOW_PORT" \
    --backend-store-uri "sqlite:///$RUNS/mlflow.db"
  wait_http "http://127.0.0.1:$MLFLOW_PORT" mlflow-ui
  local listed; listed=$("$VENV/bin/prefect" deployment ls 2>/dev/null || true)
  echo "Prefect UI: $PREFECT_UI_URL   (deployments: $(grep -c 'train/' <<<"$listed" || true) train, $(grep -c 'sweep/' <<<"$listed" || true) sweep, evaluate, align)"
  echo "MLflow UI:  $TEAMRL_MLFLOW_UI"
  echo "CLI against this server: export PREFECT_API_URL=$PREFECT_API_URL"
  echo "stop: make server-stop"
}

stop() {
  for name in prefect-worker mlflow-ui prefect-server; do
    if alive "$name"; then
      kill -TERM -- "-$(cat "$STATE/$name.pid")" 2>/dev/null || true
      for _ in $(seq 20); do alive "$name" || break; sleep 0.5; done
      alive "$name" && kill -KILL -- "-$(cat "$STATE/$name.pid")" 2>/dev/null || true
      echo "stopped $name"
    fi
    rm -f "$STATE/$name.pid"
  done
}

status() {
  for name in prefect-server prefect-worker mlflow-ui; do
    if alive "$name"; then echo "$name: running (pid $(cat "$STATE/$name.pid"))"; else echo "$name: stopped"; fi
  done
}

"${1:-start}"
