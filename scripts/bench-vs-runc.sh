#!/usr/bin/env bash
# `pagedkv generate --cache paged` against llama2.c's run.c (the reference runtime) on the same
# model, tokenizer, prompt and positions, greedy, interleaved in one run: round r runs the two
# programs one after the other, the order alternating (A B, B A, ...), so that both see the same
# load on a shared machine. Reports per round and as medians: tokens/s as each program reports it
# (run.c: "achieved tok/s", the positions after the first over the time after the first forward;
# pagedkv: tokens generated over prefill + decode), their ratio, pagedkv's p50 and mean decode
# step, and each whole process's wall time and CPU time (user + system, from wait4's rusage).
# Checks that both print the same text (the reference equality) and fails if not.
#
# run.c is not part of this repository and nothing of it is committed: build it yourself,
# outside the checkout (docs/benchmarks.md names the commit the project tests against):
#   git -C llama2.c show 350e04f:run.c > /tmp/run.c && gcc -Ofast -march=native /tmp/run.c -lm -o /tmp/run
#
# Usage: scripts/bench-vs-runc.sh RUN_BINARY [ROUNDS]     (or RUNC=path scripts/bench-vs-runc.sh)
# Environment:
#   PAGEDKV   the pagedkv binary (default build/src/cli/pagedkv)
#   STEPS     positions, prompt included (default 512, the model's whole context)
#   PROMPT    default "One day, a big bear" (../shared/reference/llama2c/p12_big_bear_n512)
#   MODEL, TOKENIZER   default models/stories260K.bin, models/tok512.bin
#   PAGEDKV_ARGS       extra flags for pagedkv generate (e.g. "--block-size 32")
# Without a run.c binary it prints why and exits 0 (skipped), so CI-like callers can run it.
set -euo pipefail
cd "$(dirname "$0")/.."
runc=${1:-${RUNC:-}}
rounds=${2:-${ROUNDS:-15}}
if [ -z "$runc" ]; then
  echo "bench-vs-runc: skipped: no run.c binary given (build llama2.c's run.c outside the" \
    "repository with gcc -Ofast -march=native run.c -lm -o run, then pass its path)"
  exit 0
fi
[ -x "$runc" ] || { echo "bench-vs-runc: $runc is not an executable" >&2; exit 2; }
pagedkv=${PAGEDKV:-build/src/cli/pagedkv}
[ -x "$pagedkv" ] || { echo "bench-vs-runc: $pagedkv not built (target pagedkv_cli)" >&2; exit 2; }

export BENCH_RUNC="$runc" BENCH_PAGEDKV="$pagedkv" BENCH_ROUNDS="$rounds"
export BENCH_STEPS=${STEPS:-512} BENCH_PROMPT=${PROMPT:-"One day, a big bear"}
export BENCH_MODEL=${MODEL:-models/stories260K.bin} BENCH_TOKENIZER=${TOKENIZER:-models/tok512.bin}
export BENCH_EXTRA=${PAGEDKV_ARGS:-}
echo "bench-vs-runc: $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "bench-vs-runc: OMP_NUM_THREADS=${OMP_NUM_THREADS:-unset}" \
  "OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-unset} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-unset}"
exec python3 - <<'EOF'
import json, os, re, resource, shlex, statistics, subprocess, sys, time

env = os.environ
steps, prompt = env["BENCH_STEPS"], env["BENCH_PROMPT"]
runc = [env["BENCH_RUNC"], env["BENCH_MODEL"], "-z", env["BENCH_TOKENIZER"], "-t", "0.0",
        "-n", steps, "-i", prompt]
pkv = [env["BENCH_PAGEDKV"], "generate", "--cache", "paged", "--model", env["BENCH_MODEL"],
       "--tokenizer", env["BENCH_TOKENIZER"], "--steps", steps, "--prompt", prompt,
       "--json"] + shlex.split(env["BENCH_EXTRA"])
print("run.c:   " + shlex.join(runc))
print("pagedkv: " + shlex.join(pkv))


def run(cmd):
    """Runs cmd; returns stdout, stderr, wall s, exit status."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = p.communicate()
    wall = time.perf_counter() - t0
    return out.decode("utf-8", "replace"), err.decode(), wall, p.returncode


def cpu_children():
    """User + system CPU s of the reaped children so far (differenced around each run)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


rows = []
for r in range(int(env["BENCH_ROUNDS"])):
    res = {}
    for name in (("runc", "pkv") if r % 2 == 0 else ("pkv", "runc")):
        c0 = cpu_children()
        out, err, wall, rc = run(runc if name == "runc" else pkv)
        cpu = cpu_children() - c0
        if rc != 0:
            sys.exit(f"bench-vs-runc: {name} exited {rc}: {err.strip()}")
        res[name] = (out, err, wall, cpu)
    out, err, wall, cpu = res["runc"]
    m = re.search(r"achieved tok/s: ([0-9.]+)", err)
    runc_tps, runc_text = float(m.group(1)), out.rstrip("\n")
    j = json.loads(res["pkv"][0])
    mode = j["modes"][0]
    if j["sequences"][0]["text"] != runc_text:
        sys.exit("bench-vs-runc: the texts differ: pagedkv is not equal to run.c")
    rows.append({"runc_tps": runc_tps, "pkv_tps": mode["tokens_per_s"],
                 "ratio": mode["tokens_per_s"] / runc_tps,
                 "p50_ms": mode["tpot_ms"]["p50"], "mean_ms": mode["tpot_ms"]["mean"],
                 "ttft_ms": mode["ttft_ms"],
                 "runc_wall": wall, "pkv_wall": res["pkv"][2],
                 "runc_cpu": cpu, "pkv_cpu": res["pkv"][3]})
    x = rows[-1]
    print(f"round {r:2d}: run.c {x['runc_tps']:8.0f} tok/s  pagedkv {x['pkv_tps']:8.0f} tok/s"
          f"  ratio {x['ratio']:.2f}  p50 {x['p50_ms']:.3f} ms  mean {x['mean_ms']:.3f} ms"
          f"  wall {x['runc_wall'] * 1e3:5.1f} / {x['pkv_wall'] * 1e3:5.1f} ms"
          f"  cpu {x['runc_cpu'] * 1e3:5.1f} / {x['pkv_cpu'] * 1e3:5.1f} ms")

med = {k: statistics.median(x[k] for x in rows) for k in rows[0]}
wins = sum(x["ratio"] >= 1.0 for x in rows)
print(f"median over {len(rows)} rounds: run.c {med['runc_tps']:.0f} tok/s, pagedkv "
      f"{med['pkv_tps']:.0f} tok/s; ratio pagedkv / run.c {med['ratio']:.2f} (>= 1 in {wins} of "
      f"{len(rows)} rounds; range {min(x['ratio'] for x in rows):.2f}-"
      f"{max(x['ratio'] for x in rows):.2f})")
print(f"pagedkv decode step: p50 {med['p50_ms']:.3f} ms, mean {med['mean_ms']:.3f} ms; "
      f"TTFT {med['ttft_ms']:.2f} ms")
print(f"whole process: wall run.c {med['runc_wall'] * 1e3:.1f} ms, pagedkv "
      f"{med['pkv_wall'] * 1e3:.1f} ms ({med['pkv_wall'] / med['runc_wall']:.2f}x); CPU run.c "
      f"{med['runc_cpu'] * 1e3:.1f} ms, pagedkv {med['pkv_cpu'] * 1e3:.1f} ms "
      f"({med['pkv_cpu'] / med['runc_cpu']:.2f}x)")
EOF
