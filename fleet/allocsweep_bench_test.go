package fleet

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/xdplb/xdplb/control"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/internal/lab/etcdlab"
)

// The fleets BenchmarkAllocatorSweep fills etcd with; see
// benchmarks/README.md, "The fleet on one etcd".
var (
	sweepHosts  = flag.String("sweep.hosts", "100,1000", "BenchmarkAllocatorSweep: fleet sizes (Host Agents), comma-separated")
	sweepDIPs   = flag.Int("sweep.dips", 10, "BenchmarkAllocatorSweep: outbound DIPs per host")
	sweepVIPs   = flag.Int("sweep.vips", 100, "BenchmarkAllocatorSweep: VIPs the DIPs' pools belong to")
	sweepRanges = flag.Int("sweep.ranges", 1, "BenchmarkAllocatorSweep: ranges each DIP holds (MinRanges is 1)")
)

// sweepFleet is the outbound allocation of a fleet as etcd holds it at
// rest: every DIP of every host holds ranges of its VIP's pool (units of
// 64 ports from 1024), each a claim under its host's lease and a guard
// without one, written as a PortAllocator writes them.
type sweepFleet struct {
	hosts, dips, vips, ranges int
	dead                      int // hosts (the first ones) whose claims are gone and whose guards cool
}

func (f sweepFleet) vip(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{198, 18, byte(i / 256), byte(i % 256)})
}

// dip is DIP d of host h: its VIP spreads a host's DIPs over the VIPs.
func (f sweepFleet) dip(h, d int) OutboundDIP {
	n := h*f.dips + d
	return OutboundDIP{VIP: f.vip(n % f.vips),
		Owner: flow.PortOwner{DIP: netip.AddrFrom4([4]byte{10, byte(n >> 16), byte(n >> 8), byte(n)}),
			Host: netip.AddrFrom4([4]byte{172, 16, byte(h >> 8), byte(h)}), VNI: uint32(100 + n%f.vips),
			MAC: [6]byte{2, 0, 0, byte(n >> 16), byte(n >> 8), byte(n)}},
		Pool: []control.PortRange{{First: 1024, Last: 65535 - 64}}, Unit: 64}
}

func hostName(h int) string { return fmt.Sprintf("host-%05d", h) }

// fill writes f's claims and guards, 64 ranges a transaction (etcd's
// default limit is 128 operations).
func (f sweepFleet) fill(ctx context.Context, c *clientv3.Client) error {
	next := map[netip.Addr]int{} // the next free unit of each VIP
	var ops []clientv3.Op
	flush := func() error {
		if len(ops) == 0 {
			return nil
		}
		_, err := c.Txn(ctx).Then(ops...).Commit()
		ops = ops[:0]
		return err
	}
	var cooling clientv3.LeaseID
	for h := range f.hosts {
		l, err := c.Grant(ctx, 3600)
		if err != nil {
			return err
		}
		a := &PortAllocator{cfg: PortAllocatorConfig{Host: hostName(h)}, k: newKeys("")}
		for d := range f.dips {
			dip := f.dip(h, d)
			for range f.ranges {
				first := uint16(1024 + 64*next[dip.VIP])
				next[dip.VIP]++
				v := a.claimOf(dip, first+63, l.ID)
				if h < f.dead {
					if cooling == 0 {
						g, err := c.Grant(ctx, 3600)
						if err != nil {
							return err
						}
						cooling = g.ID
					}
					ops = append(ops, clientv3.OpPut(a.k.portGuard(dip.VIP, first), v, clientv3.WithLease(cooling)))
				} else {
					ops = append(ops, clientv3.OpPut(a.k.portClaim(dip.VIP, first), v, clientv3.WithLease(l.ID)),
						clientv3.OpPut(a.k.portGuard(dip.VIP, first), v))
				}
				if len(ops) >= 128 {
					if err := flush(); err != nil {
						return err
					}
				}
			}
		}
	}
	return flush()
}

// countingKV counts the transactions a client makes, the keys their
// answers hold and the answers' size (protobuf bytes, as sent).
type countingKV struct {
	clientv3.KV
	txns, keys, bytes atomic.Int64
}

func (k *countingKV) Txn(ctx context.Context) clientv3.Txn {
	return txnHook{KV: k.KV, commit: k.commit}.Txn(ctx)
}

func (k *countingKV) commit(txn clientv3.Txn, _ []clientv3.Op) (*clientv3.TxnResponse, error) {
	resp, err := txn.Commit()
	k.txns.Add(1)
	if err == nil {
		k.bytes.Add(int64(proto.Size((*etcdserverpb.TxnResponse)(resp))))
		for _, r := range resp.Responses {
			k.keys.Add(int64(len(r.GetResponseRange().GetKvs())))
		}
	}
	return resp, err
}

// etcdCounter sums the embedded member's Prometheus counter name.
func etcdCounter(tb testing.TB, name string) float64 {
	mfs, err := prometheus.DefaultGatherer.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkAllocatorSweep measures one PortAllocator sweep of one host
// against one embedded etcd member holding a fleet's outbound claims and
// guards (-sweep.*: by default 100 and 1,000 hosts of 10 DIPs in 100
// VIPs, one range each) and reports per sweep: ns/op (wall), cpu-ns/op
// (this process's CPU: etcd's and the client's, both in it), txns/op,
// keys/op (in the answers), resp-B/op (the answers' size),
// etcd-sent-B/op (etcd's gRPC bytes sent to clients) and ranges/op
// (etcd_mvcc_range_total); then, with the fleet's one sweeper sweeping
// once per default Sweep (10 minutes on average), the fleet's sweeps/s,
// etcd's fleet-keys/s, fleet-MB/s sent and fleet-cpu-ms/s (CPU ms a
// second, measured here, for what etcd and the client did together).
// The sweep timed is not on condition of an election key (the
// sweeper's compares one key's create revision in its keys read).
// "cooling=1" has one dead host's guards cooling (its claims gone, its
// guards under a guard lease, for an hour after it died); an untimed
// sweep comes first, so what is timed is a sweep after one that read
// them (which remembers them: coolingSeen). "read-vip" is one VIP's
// read as every claim makes it, for comparison. Skipped with -short.
//
//	go test -run '^$' -bench AllocatorSweep -benchtime 200x ./fleet/
func BenchmarkAllocatorSweep(b *testing.B) {
	if testing.Short() {
		b.Skip("fills etcd with a fleet's keys")
	}
	for _, s := range strings.Split(*sweepHosts, ",") {
		hosts, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || hosts < 2 {
			b.Fatalf("-sweep.hosts: %q", s)
		}
		f := sweepFleet{hosts: hosts, dips: *sweepDIPs, vips: *sweepVIPs, ranges: *sweepRanges}
		b.Run(fmt.Sprintf("hosts=%d", hosts), func(b *testing.B) { benchSweep(b, f, false) })
		if hosts == 1000 {
			f.dead = 1
			b.Run(fmt.Sprintf("hosts=%d/cooling=1", hosts), func(b *testing.B) { benchSweep(b, f, false) })
			f.dead = 0
			b.Run(fmt.Sprintf("hosts=%d/read-vip", hosts), func(b *testing.B) { benchSweep(b, f, true) })
		}
	}
}

func benchSweep(b *testing.B, f sweepFleet, readVIP bool) {
	cluster := etcdlab.NewCluster(b.TempDir(), 1) // removed by the testing package
	srv, err := cluster.Start(0, time.Minute)
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	c, err := etcdlab.Client(cluster.Endpoints())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	t0 := time.Now()
	if err := f.fill(ctx, c); err != nil {
		b.Fatal(err)
	}
	b.Logf("%d hosts × %d DIPs × %d ranges in %d VIPs: %d claims, %d guards written in %v",
		f.hosts, f.dips, f.ranges, f.vips, (f.hosts-f.dead)*f.dips*f.ranges, f.hosts*f.dips*f.ranges, time.Since(t0).Round(time.Millisecond))

	// The sweeper: the last host, with its DIPs wanted.
	kv := &countingKV{KV: c.KV}
	h := f.hosts - 1
	a, err := NewPortAllocator(PortAllocatorConfig{Client: &clientv3.Client{KV: kv, Lease: c.Lease, Watcher: c.Watcher},
		Host: hostName(h), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	want := map[dipKey]OutboundDIP{}
	for d := range f.dips {
		want[keyOfDIP(f.dip(h, d))] = f.dip(h, d)
	}
	op := func() error { return a.sweep(ctx, want) }
	if readVIP {
		op = func() error { _, err := a.read(ctx, f.vip(0)); return err }
	}
	if err := op(); err != nil { // warm the connection and etcd's caches
		b.Fatal(err)
	}
	kv.txns.Store(0)
	kv.keys.Store(0)
	kv.bytes.Store(0)
	sent0, ranges0 := etcdCounter(b, "etcd_network_client_grpc_sent_bytes_total"), etcdCounter(b, "etcd_mvcc_range_total")
	cpu0 := cpuTime(b)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if err := op(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	n := float64(b.N)
	cpu := float64(cpuTime(b)-cpu0) / n
	sent := (etcdCounter(b, "etcd_network_client_grpc_sent_bytes_total") - sent0) / n
	keys := float64(kv.keys.Load()) / n
	b.ReportMetric(cpu, "cpu-ns/op")
	b.ReportMetric(float64(kv.txns.Load())/n, "txns/op")
	b.ReportMetric(keys, "keys/op")
	b.ReportMetric(float64(kv.bytes.Load())/n, "resp-B/op")
	b.ReportMetric(sent, "etcd-sent-B/op")
	b.ReportMetric((etcdCounter(b, "etcd_mvcc_range_total")-ranges0)/n, "ranges/op")
	if c := a.Counters(); c.Swept != 0 || c.Cooling != 0 {
		b.Fatalf("the sweep cooled %d guards of a fleet at rest", c.Cooling)
	}
	if readVIP {
		return
	}
	// One sweeper (sweepAsSweeper) sweeps once per Sweep on average
	// (sweepDelay), whatever the number of hosts.
	perSec := 1 / a.cfg.Sweep.Seconds()
	b.ReportMetric(perSec, "fleet-sweeps/s")
	b.ReportMetric(perSec*keys, "fleet-keys/s")
	b.ReportMetric(perSec*sent/1e6, "fleet-MB/s")
	b.ReportMetric(perSec*cpu/1e6, "fleet-cpu-ms/s")
}
