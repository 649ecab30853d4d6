// Command pipeline runs the Mux's balancing pipeline (parse → balance:
// rules → connection table → Maglev) over the in-memory port: it offers
// packets of many client flows to a VIP served by weighted backends, and
// prints how flows spread over the backends against their weights, the
// drops by reason, and the rate. It needs no root and no network.
package main

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"sort"
	"time"

	"github.com/xdplb/xdplb/balance"
	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/flow"
	"github.com/xdplb/xdplb/header"
)

func main() {
	flows := flag.Int("flows", 10000, "distinct client flows")
	packets := flag.Int("packets", 2_000_000, "packets to run through the pipeline")
	flag.Parse()
	if err := run(*flows, *packets); err != nil {
		fmt.Fprintln(os.Stderr, "pipeline:", err)
		os.Exit(1)
	}
}

func run(nflows, npackets int) error {
	if nflows < 1 || npackets < 1 {
		return fmt.Errorf("-flows and -packets must be positive")
	}
	vip := netip.MustParseAddr("198.18.100.1")
	pool := []flow.Backend{
		{Name: "dip-a", Addr: netip.MustParseAddr("198.19.1.1"), Host: netip.MustParseAddr("198.19.0.1"), Weight: 1},
		{Name: "dip-b", Addr: netip.MustParseAddr("198.19.1.2"), Host: netip.MustParseAddr("198.19.0.1"), Weight: 1},
		{Name: "dip-c", Addr: netip.MustParseAddr("198.19.1.3"), Host: netip.MustParseAddr("198.19.0.2"), Weight: 2},
		{Name: "dip-d", Addr: netip.MustParseAddr("198.19.1.4"), Host: netip.MustParseAddr("198.19.0.2"), Weight: 4},
	}
	rules := flow.NewRules()
	if _, err := rules.Update(1, []flow.Rule{{Name: "web", VIP: flow.VIP{Addr: vip, Proto: flow.ProtoTCP, Port: 80}, Backends: pool}}); err != nil {
		return err
	}
	// The connection table places flows by the fleet's hash, so the
	// balance stage hashes each packet once (for Maglev and the table).
	hasher := flow.NewHasher(0x5eed)
	conns, err := flow.NewConnTable(flow.ConnTableConfig{Capacity: 2 * nflows, Hasher: &hasher})
	if err != nil {
		return err
	}
	bal, err := balance.New(balance.Config{Rules: rules, Conns: conns, Hasher: hasher})
	if err != nil {
		return err
	}

	// A stage at the end of the pipeline counts packets and new flows per
	// backend, as the encapsulation stage would see them.
	// Frames are replayed in order, so the first nflows packets are the
	// first packets of every flow.
	perBackend := make([]int, len(pool))
	counted := 0
	tally := engine.StageFunc(func(b *engine.Batch) {
		for _, p := range b.Packets() {
			if counted < nflows {
				perBackend[p.Backend]++
				counted++
			}
		}
	})
	port, err := engine.NewMemPort(engine.MemPortConfig{Name: "mem0"})
	if err != nil {
		return err
	}
	frames := make([][]byte, nflows)
	for i := range frames {
		frames[i] = synFrame(netip.AddrFrom4([4]byte{198, 18, byte(i >> 16), byte(i >> 8)}), uint16(i), vip)
	}
	port.Replay(frames)
	w, err := engine.NewWorker(engine.WorkerConfig{Ports: []engine.Port{port},
		Inputs: []engine.Input{{Port: 0, Pipeline: engine.NewPipeline(engine.Parse{}, bal, tally)}}})
	if err != nil {
		return err
	}
	start := time.Now()
	for done := 0; done < npackets; {
		done += w.Poll()
	}
	elapsed := time.Since(start)
	var s engine.Stats
	w.Counters().Snapshot(&s)

	fmt.Printf("VIP %v:80 over %d backends, %d flows, %d packets\n\n", vip, len(pool), nflows, s.RX)
	var total uint32
	for _, b := range pool {
		total += b.Weight
	}
	fmt.Printf("%-8s %7s %8s %8s\n", "backend", "weight", "flows", "share")
	for i, b := range rules.Load().Rules()[0].Backends {
		fmt.Printf("%-8s %7.3f %8d %8.3f\n", b.Name, float64(b.Weight)/float64(total), perBackend[i], float64(perBackend[i])/float64(nflows))
	}
	drops := s.DropsByName()
	keys := make([]string, 0, len(drops))
	for k := range drops {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	fmt.Printf("\nforwarded %d, dropped %d %v\n", s.TX, s.Dropped(), drops)
	fmt.Printf("connection table: %d flows\n", conns.Len())
	fmt.Printf("%.1f Mpps on one core (%.0f ns/packet)\n",
		float64(s.RX)/elapsed.Seconds()/1e6, float64(elapsed.Nanoseconds())/float64(s.RX))
	return nil
}

// synFrame builds an Ethernet/IPv4/TCP SYN from src:sport to vip:80.
func synFrame(src netip.Addr, sport uint16, vip netip.Addr) []byte {
	f := make([]byte, header.EthernetSize+header.IPv4MinSize+header.TCPMinSize)
	header.Ethernet(f).Encode(header.MAC{2, 0, 0, 0, 0, 2}, header.MAC{2, 0, 0, 0, 0, 1}, header.EtherTypeIPv4)
	ip := header.IPv4(f[header.EthernetSize:])
	ip.Encode(&header.IPv4Fields{TotalLength: header.IPv4MinSize + header.TCPMinSize, TTL: 64,
		Protocol: flow.ProtoTCP, Src: src.As4(), Dst: vip.As4()})
	tcp := header.TCP(ip[header.IPv4MinSize:])
	tcp.SetSrcPort(sport)
	tcp.SetDstPort(80)
	tcp.SetDataOffset(header.TCPMinSize)
	tcp.SetFlags(header.TCPFlagSyn)
	tcp.SetWindow(65535)
	tcp.SetChecksum(tcp.CalculateChecksum(header.PseudoHeaderChecksum(flow.ProtoTCP, ip.SrcSlice(), ip.DstSlice(), header.TCPMinSize)))
	return f
}
