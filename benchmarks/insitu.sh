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
# Per round and binary: the rate forwarded, the DUT's whole CPU per packet
# (pktrate's, kernel threads included), then the process's samples per
# forwarded packet (in ns): all of them, the kernel's (sendto, poll), and
# xdplb's (the pipeline and the port), with its largest parts.
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
command -v perf >/dev/null || { echo "needs perf (apt install linux-perf)" >&2; exit 2; }
d=$(mktemp -d)
wt="$d/base"
trap 'git worktree remove --force "$wt" >/dev/null 2>&1 || true; rm -rf "$d"' EXIT
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
		sleep 3 # past the warm-up, inside the window
		perf record -q -e cpu-clock -F $freq -p "$pid" -o "$d/perf.data" -- sleep "$secs" >/dev/null 2>&1
		wait $run
		row=$(grep "^| $dut " "$d/out" | awk -F'|' '{ print $8, $11 }')
		perf report -n -i "$d/perf.data" --no-children --sort sym --stdio 2>/dev/null | grep -v '^#' |
			awk -v row="$row" -v v=$v -v r=$r -v secs=$secs -v freq=$freq '
				NF >= 3 && $1 ~ /%$/ {
					n = $2; all += n
					if ($0 ~ /\[k\]/) k += n
					if ($0 ~ /xdplb\/xdplb/) {
						x += n; s = $0; sub(/.*xdplb\/xdplb\//, "", s); sub(/\.abi0$/, "", s)
						part[s] += n
					}
				}
				END {
					split(row, a, " "); f = 1e9 / freq / (a[1] * 1e6 * secs)
					printf "round %d %-6s fwd %s Mpps, DUT %s ns/pkt; process %.0f, kernel %.0f, xdplb %.0f:", r, v, a[1], a[2], all * f, k * f, x * f
					m = 0
					while (m < 5) {
						best = ""; bn = 0
						for (s in part) if (part[s] > bn) { bn = part[s]; best = s }
						if (best == "") break
						printf " %s %.0f", best, bn * f; delete part[best]; m++
					}
					printf "\n"
				}'
	done
done | tee "$d/rounds"
echo "medians of xdplb ns/pkt:"
awk '{ for (i = 1; i < NF; i++) if ($i == "xdplb") { v = $(i+1); sub(":", "", v); print $3, v } }' "$d/rounds" |
	sort -k1,1 -k2,2n | awk '{ x[$1, ++n[$1]] = $2 } END { for (k in n) { m = n[k]; printf "%s %s\n", k, (m % 2 ? x[k, (m+1)/2] : (x[k, m/2] + x[k, m/2+1]) / 2) } }'
