#!/usr/bin/env bash
# A/B of the API: two embedded servers side by side (the tree at $OLD_REV and this checkout's HEAD, each a git
# worktree in /tmp sharing this checkout's .venv, each on its own SQLite file), then $ROUNDS interleaved rounds of
# benchmarks/serving.py (this checkout's client for both); everything under $OUT (runN_<side>.out/.err/.load).
#   OLD_REV=fe71596 ROUNDS=3 OUT=benchmarks/results/<machine>-<date>-serving-ab benchmarks/ab_serving.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OLD_REV=${OLD_REV:-fe71596}
OUT=${OUT:-$ROOT/benchmarks/results/serving-ab}
ROUNDS=${ROUNDS:-3}
mkdir -p "$OUT"
rm -rf /tmp/ab_old /tmp/ab_new
git -C $ROOT worktree remove --force /tmp/ab_old 2>/dev/null || true
git -C $ROOT worktree remove --force /tmp/ab_new 2>/dev/null || true
git -C $ROOT worktree add -f /tmp/ab_old "$OLD_REV" >/dev/null
git -C $ROOT worktree add -f /tmp/ab_new HEAD >/dev/null
declare -A PORT=([old]=8171 [new]=8172) KEY PID
for side in old new; do
  tree=/tmp/ab_$side; ln -sfn $ROOT/.venv $tree/.venv
  export_env="env -u REDIS_URL -u DATABASE_URL DEBUG=1 SECRET_KEY=ab-serving-secret HF_HUB_OFFLINE=1 LOG_LEVEL=WARNING DATABASE_URL=sqlite:////tmp/ab_$side.sqlite3"
  rm -f /tmp/ab_$side.sqlite3
  (cd $tree && $export_env .venv/bin/python manage.py migrate --noinput -v 0 && $export_env .venv/bin/python manage.py bootstrap --admin-password ab-admin-password-1 >/dev/null
   $export_env .venv/bin/python manage.py create_tenant --slug ab --tier enterprise >/dev/null)
  KEY[$side]=$(cd $tree && $export_env .venv/bin/python manage.py create_api_key --tenant ab --name ab --json | .venv/bin/python -c "import json,sys;print(json.load(sys.stdin)['key'])")
  (cd $tree && exec $export_env .venv/bin/python -m uvicorn platform_site.asgi:application --host 127.0.0.1 --port ${PORT[$side]} --lifespan off > $OUT/server_$side.log 2>&1) &
  PID[$side]=$!
done
for side in old new; do
  for i in $(seq 60); do curl -sf http://127.0.0.1:${PORT[$side]}/healthz >/dev/null && break; sleep 1; done
done
run() {  # side, name
  uptime > $OUT/$2.load
  $ROOT/.venv/bin/python $ROOT/benchmarks/serving.py --url http://127.0.0.1:${PORT[$1]} --key ${KEY[$1]} \
    --concurrency 8 --requests 32 --prompt-words 96 --max-tokens 32 --no-engine --floor-requests 0 --json \
    > $OUT/$2.out 2> $OUT/$2.err || echo "run $2 failed" >&2
  uptime >> $OUT/$2.load
}
n=0
for r in $(seq $ROUNDS); do
  if (( r % 2 )); then order="old new"; else order="new old"; fi
  for side in $order; do n=$((n+1)); run $side run${n}_$side; done
done
kill ${PID[old]} ${PID[new]} 2>/dev/null || true
wait 2>/dev/null || true
git -C $ROOT worktree remove --force /tmp/ab_old; git -C $ROOT worktree remove --force /tmp/ab_new
echo done
