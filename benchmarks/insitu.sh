#!/usr/bin/env bash
# Measures a change on a node's data path in situ: the DUT process under
# examples/pktrate, its user time per forwarded packet split by where it
# goes, from perf's cpu-clock samples of the process. Builds the DUT's
# binary at a base revision (default main) and from the working tree and
# alternates them round by round, as abrev.sh does for the in-memory
# benchmarks. In memory the frames are hot in the cache; here the kernel
# has just written them on another core, which is what the data path
# meets on a real port. Needs root and perf (Debian: linux-perf).
#
#   benchmarks/insitu.sh                    # main against the working tree
#   ROUNDS=6 FLOWS=1M LOAD=max benchmarks/insitu.sh 2b38bd5
#   DUT=hostagent benchmarks/insitu.sh
#   PKTRATE_ARGS="-conns 4k" benchmarks/insitu.sh   # more pktrate flags
#
#   SECONDS_PERF=10 benchmarks/insitu.sh             # a longer sample (5 s)
#
# Per round and binary: the rate forwarded and the DUT's whole CPU per
# packet (pktrate's row, kernel threads included), then the process's
# samples per packet it sent while perf ran (its interfaces' TX counters,
# read before and after, so the figures hold whenever the sample falls):
# all of them, the kernel's (sendto, poll), and xdplb's (the pipeline and
# the port; for l2fwd its main package too), with the largest parts.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-main}
rounds=${ROUNDS:-4}
dut=${DUT:-mux}
flows=${FLOWS:-1k}
load=${LOAD:-300k}
secs=${SECONDS_PERF:-5}
freq=4999
case $dut in
mux) binflag=-mux-bin ;;
hostagent) binflag=-hostagent-bin ;;
l2fwd-1arm | l2fwd) binflag=-l2fwd-bin ;;
*) echo "DUT must be mux, hostagent, l2fwd or l2fwd-1arm" >&2; exit 2 ;;
esac
pkg=./examples/${dut%-1arm}
case $flows$load in
*,*) echo "FLOWS and LOAD take one value each" >&2; exit 2 ;;
esac
command -v perf >/dev/null || { echo "needs perf (apt install linux-perf)" >&2; exit 2; }
d=$(mktemp -d)
wt="$d/base"
run=
trap '[ -n "$run" ] && kill "$run" 2>/dev/null; wait 2>/dev/null; git worktree remove --force "$wt" >/dev/null 2>&1 || true; rm -rf "$d"' EXIT
# txsum prints the packets the interfaces of process $1's network
# namespace have sent (lo aside).
txsum() {
	awk -F'[: ]+' 'NR > 2 { sub(/^ +/, ""); split($0, f, /[: ]+/); if (f[1] != "lo") n += f[11] } END { print n + 0 }' "/proc/$1/net/dev"
}
git worktree add --detach "$wt" "$base" >/dev/null
(cd "$wt" && go build -o "$d/dut.before" "$pkg")
go build -o "$d/dut.after" "$pkg"
go build -o "$d/pktrate" ./examples/pktrate
for r in $(seq 1 "$rounds"); do
	for v in before after; do
		"$d/pktrate" -duts "$dut" -size 64 -flows "$flows" -load "$load" -duration $((secs + 4))s \
			-warmup 1s -trials 1 "$binflag" "$d/dut.$v" ${PKTRATE_ARGS:-} >"$d/out" 2>&1 &
		run=$!
		pid=
		for _ in $(seq 1 120); do
			pid=$(pgrep -f "^$d/dut.$v" | head -1 || true)
			[ -n "$pid" ] && break
			sleep 0.25
		done
		[ -n "$pid" ] || { cat "$d/out" >&2; exit 1; }
		sleep 3 # the DUT attached and traffic flowing (the packets are counted, not assumed)
		# The TX counters are read by the command perf runs, so the packets
		# counted and the samples cover the same window.
		perf record -q -e cpu-clock -F $freq -p "$pid" -o "$d/perf.data" -- \
			bash -c "$(declare -f txsum); txsum $pid >'$d/tx0'; sleep $secs; txsum $pid >'$d/tx1'" \
			>/dev/null 2>"$d/perf.err" || { cat "$d/perf.err" >&2; exit 1; }
		tx0=$(cat "$d/tx0") tx1=$(cat "$d/tx1")
		wait $run || { cat "$d/out" >&2; exit 1; }
		run=
		row=$(grep "^| $dut " "$d/out" | head -1 | awk -F'|' '{ print $8, $11 }')
		perf report -n -i "$d/perf.data" --no-children --sort sym --stdio 2>/dev/null | grep -v '^#' |
			awk -v row="$row" -v v=$v -v r=$r -v pk=$((tx1 - tx0)) -v freq=$freq '
				NF >= 3 && $1 ~ /%$/ {
					n = $2; all += n
					if ($0 ~ /\[k\]/) k += n
					if ($0 ~ /xdplb\/xdplb\/|\[\.\] main\./) {
						x += n; s = $0; sub(/^.*\[\.\] /, "", s); sub(/github\.com\/xdplb\/xdplb\//, "", s); sub(/\.abi0$/, "", s)
						part[s] += n
					}
				}
				END {
					split(row, a, " ")
					if (pk <= 0) { printf "round %d %-6s no packets sent while perf ran\n", r, v; exit }
					f = 1e9 / freq / pk
					printf "round %d %-6s fwd %s Mpps, DUT %s ns/pkt; %d packets sampled: process %.0f, kernel %.0f, xdplb %.0f:", r, v, a[1], a[2], pk, all * f, k * f, x * f
					m = 0
					while (m < 5) {
						best = ""; bn = 0
						for (s in part) if (part[s] > bn) { bn = part[s]; best = s }
						if (best == "") break
						printf " %s %.0f", best, bn * f; delete part[best]; m++
					}
					printf "\n"
				}' | tee -a "$d/rounds"
	done
done
echo "medians of xdplb ns/pkt:"
awk '{ for (i = 1; i < NF; i++) if ($i == "xdplb") { v = $(i+1); sub(":", "", v); print $3, v } }' "$d/rounds" |
	sort -k1,1 -k2,2n | awk '{ x[$1, ++n[$1]] = $2 } END { for (k in n) { m = n[k]; printf "%s %s\n", k, (m % 2 ? x[k, (m+1)/2] : (x[k, m/2] + x[k, m/2+1]) / 2) } }'
