#!/usr/bin/env bash
# Issue 18, item 5: two engine instances share KV through the tiers below their pools.
#   disk:  instance A writes its blocks to a disk-tier file; instance B, a separate process,
#          onboards them from the same file.
#   redis: a real redis-server on 127.0.0.1 at a free port; A stores, B onboards, and B's
#          tokens equal a cold run's (and the contiguous reference's, --cache all).
#   faults: the server killed before a run (served by recompute), a corrupt value under a key
#          (refused, counted, never a wrong hit), another model's instance (shares nothing).
# Usage: two_instances.sh PAGEDKV_CLI WORK_DIR. Exit 77 (skipped) when redis-server is
# missing, unless CI=true, where that is a failure. Prefill tokens are counted, not timed.
set -euo pipefail
cli=$1
work=$2
rm -rf "$work" && mkdir -p "$work"
cd "$work"

fail() { echo "two_instances: FAIL: $*" >&2; exit 1; }
field() {  # field FILE EXPR: a value of the JSON in FILE (modes[0] is the paged run)
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$1"
}
tokens() { field "$1" "[s['generated_ids'] for s in j['sequences']]"; }

# Three prompts behind one long shared prefix (about 150 tokens of stories260K's tokenizer).
prefix="Once upon a time, there was a little girl named Lily. She lived in a small house with her \
mom and dad and her dog Max. Every morning Lily woke up early, put on her red shoes and ran into \
the garden to look at the flowers. One day she saw a big yellow bird sitting on the fence. The \
bird was singing a happy song, and Lily wanted to sing with it. She sat down on the grass and \
listened very carefully. Then she"
{
  echo "$prefix smiled and waved."
  echo "$prefix asked her mom for some bread."
  echo "$prefix ran to tell Max."
} > prompts.txt
common=(--prompts prompts.txt --steps 240 --block-size 16 --json)

"$cli" generate "${common[@]}" --cache paged > cold.json || fail "cold run"
cold=$(tokens cold.json)

# ---- disk tier shared through one file --------------------------------------------------------
"$cli" generate "${common[@]}" --cache paged --tier-disk disk.tier --tier-disk-mib 8 > disk_a.json ||
  fail "disk instance A"
[ "$(field disk_a.json "j['modes'][0]['prefix_cache']['onboarded_tokens']")" = 0 ] ||
  fail "disk A onboarded from an empty tier"
"$cli" generate "${common[@]}" --cache paged --tier-disk disk.tier --tier-disk-mib 8 > disk_b.json ||
  fail "disk instance B"
onboarded=$(field disk_b.json "j['modes'][0]['prefix_cache']['onboarded_tokens']")
# Each prompt's shared full blocks (and its own up to len - 1) come from the file.
[ "$onboarded" -ge 3 ] && [ $((onboarded % 16)) = 0 ] || fail "disk B onboarded $onboarded tokens"
[ "$(tokens disk_b.json)" = "$cold" ] || fail "disk B's tokens differ from the cold run's"
echo "disk: instance B onboarded $onboarded prompt tokens from A's file; tokens equal the cold run"

# ---- Redis -------------------------------------------------------------------------------------
server=$(command -v redis-server || true)
[ -z "$server" ] && [ -x /usr/sbin/redis-server ] && server=/usr/sbin/redis-server
[ -z "$server" ] && [ -x /usr/bin/redis-server ] && server=/usr/bin/redis-server
if [ -z "$server" ]; then
  [ "${CI:-}" = "true" ] && fail "redis-server is not installed (CI installs Debian redis-server)"
  echo "two_instances: SKIP the Redis part: redis-server is not installed"
  exit 77
fi
port=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])")
pid=""
start_server() {
  "$server" --port "$port" --bind 127.0.0.1 --save "" --appendonly no --maxmemory 64mb \
    --maxmemory-policy allkeys-lru --daemonize no > redis.log 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && return 0
    sleep 0.05
  done
  fail "redis-server did not answer on port $port"
}
stop_server() { if [ -n "$pid" ]; then kill -9 "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi; pid=""; }
trap stop_server EXIT
start_server
redis=(--tier-redis "127.0.0.1:$port")

"$cli" generate "${common[@]}" --cache paged "${redis[@]}" --kv-events events_a.jsonl > redis_a.json ||
  fail "redis instance A"
keys=$(redis-cli -p "$port" --scan --pattern 'pagedkv:v1:*' | wc -l)
[ "$keys" -gt 0 ] || fail "instance A stored no key"
# A's fingerprint (keys are pagedkv:v1:<fingerprint>:<block hash>): the fp16 instance below
# stores the same block hashes under its own.
fingerprint=$(redis-cli -p "$port" --scan --pattern 'pagedkv:v1:*' | head -1 | cut -d: -f3)
grep -q '"type":"BlockStored"' events_a.jsonl || fail "no BlockStored event"
grep -q '"medium":"REDIS"' events_a.jsonl || fail "no event names the REDIS medium"
# B runs all three caches: the paged one, with its prefix onboarded, agrees with the others.
"$cli" generate "${common[@]}" --cache all "${redis[@]}" > redis_b.json || fail "redis instance B"
onboarded=$(field redis_b.json "j['modes'][0]['prefix_cache']['onboarded_tokens']")
[ "$onboarded" -ge 3 ] || fail "redis B onboarded $onboarded tokens"
[ "$(tokens redis_b.json)" = "$cold" ] || fail "redis B's tokens differ from the cold run's"
[ "$(field redis_b.json "all(a['ok'] for a in j['agreement'])")" = True ] ||
  fail "redis B disagrees with the contiguous reference"
echo "redis: $keys keys; instance B onboarded $onboarded prompt tokens; tokens equal the cold run"

# An instance whose K/V bytes differ (fp16 pages: another fingerprint) shares nothing, though
# its prompts' token ids and block hashes are the same.
"$cli" generate "${common[@]}" --cache paged --kv-dtype fp16 "${redis[@]}" > other.json ||
  fail "the fp16 instance"
[ "$(field other.json "j['modes'][0]['prefix_cache']['onboarded_tokens']")" = 0 ] ||
  fail "an instance with another fingerprint onboarded blocks"

# A corrupt value under one key: refused and counted; the tokens still equal the cold run's.
# The key of the first prompt block A stored in Redis (its BlockStored event has no parent):
# every prompt's prefix starts with it, so every sequence of the next run must refuse it.
first=$(python3 -c "
import json, sys
for line in open(sys.argv[1]):
    for e in json.loads(line)['events']:
        if e['type'] == 'BlockStored' and e['medium'] == 'REDIS' and e['parent_block_hash'] is None:
            print('%016x' % e['block_hashes'][0]); sys.exit(0)" events_a.jsonl)
key="pagedkv:v1:$fingerprint:$first"
[ "$(redis-cli -p "$port" exists "$key")" = 1 ] || fail "no key $key for the first block"
redis-cli -p "$port" set "$key" "not a block record" > /dev/null
"$cli" generate "${common[@]}" --cache paged "${redis[@]}" > corrupt.json || fail "corrupt run"
refused=$(field corrupt.json "j['modes'][0]['prefix_cache']['refused_records']")
[ "$refused" = 3 ] || fail "the corrupt first block was refused $refused times, not 3"
[ "$(tokens corrupt.json)" = "$cold" ] || fail "a corrupt value changed the tokens"
# That run stored the block again over the refused copy: the next instance onboards it.
"$cli" generate "${common[@]}" --cache paged "${redis[@]}" > repaired.json || fail "repaired run"
[ "$(field repaired.json "j['modes'][0]['prefix_cache']['refused_records']")" = 0 ] ||
  fail "the corrupt value was not repaired"
[ "$(field repaired.json "j['modes'][0]['prefix_cache']['onboarded_tokens']")" -ge 16 ] ||
  fail "nothing onboarded after the repair"
echo "redis: a corrupt value was refused ($refused records), then repaired by the next store"

# The server killed: the instance serves by recompute, logs the failure once, exits 0.
stop_server
"$cli" generate "${common[@]}" --cache paged "${redis[@]}" > down.json 2> down.err ||
  fail "the run with the server down failed"
[ "$(tokens down.json)" = "$cold" ] || fail "tokens differ with the server down"
[ "$(field down.json "j['modes'][0]['prefix_cache']['onboarded_tokens']")" = 0 ] ||
  fail "onboarded with the server down"
[ "$(grep -c unavailable down.err)" = 1 ] || fail "the failure was not logged exactly once"
echo "redis: server down -> served by recompute, one log line; tokens equal the cold run"
echo "two_instances: OK"
