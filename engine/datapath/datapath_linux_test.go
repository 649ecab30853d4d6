//go:build linux

package datapath

import (
	"net/netip"
	"sync"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/steer"
	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// veth creates name <-> name+"p", up, with queues RX/TX queues per end,
// and returns name's index.
func veth(t *testing.T, name string, queues int) int {
	t.Helper()
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, NumTxQueues: queues, NumRxQueues: queues},
		PeerName: name + "p", PeerNumTxQueues: uint32(queues), PeerNumRxQueues: uint32(queues)}
	require.NoError(t, netlink.LinkAdd(v))
	t.Cleanup(func() { _ = netlink.LinkDel(v) })
	var index int
	for _, n := range []string{name, name + "p"} {
		l, err := netlink.LinkByName(n)
		require.NoError(t, err)
		require.NoError(t, netlink.LinkSetUp(l))
		if n == name {
			index = l.Attrs().Index
		}
	}
	return index
}

// xdpProgID is the id of the XDP program on the interface (0: none).
func xdpProgID(t *testing.T, name string) uint32 {
	t.Helper()
	l, err := netlink.LinkByName(name)
	require.NoError(t, err)
	if x := l.Attrs().Xdp; x != nil && x.Attached {
		return x.ProgId
	}
	return 0
}

// foreignXDP attaches a program that is not a steering program to name.
func foreignXDP(t *testing.T, name string) uint32 {
	t.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "xdp_other", Type: ebpf.XDP, License: "MIT",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2 /* XDP_PASS */), asm.Return()}})
	require.NoError(t, err)
	t.Cleanup(func() { prog.Close() })
	l, err := netlink.LinkByName(name)
	require.NoError(t, err)
	require.NoError(t, netlink.LinkSetXdpFdWithFlags(l, prog.FD(), nl.XDP_FLAGS_DRV_MODE))
	id := xdpProgID(t, name)
	require.NotZero(t, id)
	return id
}

func removeXDP(t *testing.T, name string) {
	t.Helper()
	l, err := netlink.LinkByName(name)
	require.NoError(t, err)
	require.NoError(t, netlink.LinkSetXdpFdWithFlags(l, -1, nl.XDP_FLAGS_DRV_MODE))
}

var (
	rulesA = steer.Config{Dst: []steer.DstRule{{Addr: netip.MustParseAddr("198.18.100.1"), Proto: steer.ProtoTCP, Port: 80}}}
	rulesB = steer.Config{Dst: []steer.DstRule{{Addr: netip.MustParseAddr("198.18.100.2")}}}
)

// recorder is a Spec.Pipeline that records its calls.
type recorder struct {
	mu     sync.Mutex
	inputs []Input
}

func (r *recorder) pipeline(in Input) (*engine.Pipeline, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.inputs = append(r.inputs, in)
	return engine.NewPipeline(), nil
}

// TestOpenClose opens a two-interface data path (two queues on the first,
// three on the second), checks what Open made and how it numbered it, and
// that Close leaves nothing attached.
func TestOpenClose(t *testing.T) {
	netlab.EnterNetns(t)
	up := veth(t, "dpup", 2)
	vm := veth(t, "dpvm", 3)
	var rec recorder
	spec := Spec{Interfaces: []Interface{{Name: "dpup", Steer: rulesA}, {Name: "dpvm", DropNoSocket: true}},
		SlowPath: true, Pipeline: rec.pipeline}
	dp, err := Open(spec, nil)
	require.NoError(t, err)

	require.Len(t, dp.Engine().Workers(), 2, "workers: the fewest queues")
	require.Equal(t, 5, dp.Sockets())
	require.NotNil(t, dp.SlowPath())
	links := dp.Links()
	require.Len(t, links, 2)
	require.Equal(t, up, links[0].Ifindex)
	require.Equal(t, vm, links[1].Ifindex)
	require.Len(t, links[0].Sockets, 2)
	require.Len(t, links[1].Sockets, 3)
	require.Equal(t, rulesA.Normalize(), links[0].Program.Config())
	for _, l := range links {
		require.NotZero(t, xdpProgID(t, l.Name), "%s: attached", l.Name)
		for q, s := range l.Sockets {
			require.Equal(t, q, s.Queue())
		}
	}
	// One pipeline per (interface, worker), workers in order, told the
	// numbering and every ifindex.
	require.Len(t, rec.inputs, 4)
	for k, in := range rec.inputs {
		require.Equal(t, k/2, in.Worker)
		require.Equal(t, k%2, in.Interface)
		require.Equal(t, spec.Interfaces[in.Interface].Name, in.Name)
		require.Equal(t, 2, in.Workers)
		require.Equal(t, []int{up, vm}, in.Ifindex)
		require.Equal(t, "0:dpup 1:dpvm 2:slow", in.Layout.String())
	}

	require.Error(t, dp.Steer(rulesB), "one config per interface")
	require.NoError(t, dp.Steer(rulesB, steer.Config{}))
	require.Equal(t, rulesB.Normalize(), links[0].Program.Config())
	// Whole or not at all: the second interface refuses its rules (a port
	// without a protocol), and the first gets its running ones back.
	bad := steer.Config{Dst: []steer.DstRule{{Addr: netip.MustParseAddr("198.18.100.3"), Port: 80}}}
	require.ErrorIs(t, dp.Steer(rulesA, bad), steer.ErrInvalidRule)
	require.Equal(t, rulesB.Normalize(), links[0].Program.Config(), "the first interface's running rules")
	require.Equal(t, steer.Config{}.Normalize(), links[1].Program.Config(), "the second's")

	require.NoError(t, dp.Close())
	require.Zero(t, xdpProgID(t, "dpup"))
	require.Zero(t, xdpProgID(t, "dpvm"))

	// The sockets are closed: the queues take new ones.
	dp, err = Open(spec, nil)
	require.NoError(t, err)
	require.NoError(t, dp.Close())
}

// TestOpenFailureReleasesEverything: a foreign XDP program on the second
// interface fails the last step (attach); everything Open made before is
// released — the first interface's program detached, its sockets closed
// (a new Open binds the same queues) — and the foreign program stays.
func TestOpenFailureReleasesEverything(t *testing.T) {
	netlab.EnterNetns(t)
	veth(t, "dpa", 2)
	veth(t, "dpb", 1)
	foreign := foreignXDP(t, "dpb")
	spec := Spec{Interfaces: []Interface{{Name: "dpa", Steer: rulesA}, {Name: "dpb"}}, SlowPath: true,
		Pipeline: nopPipeline}
	dp, err := Open(spec, nil)
	require.ErrorIs(t, err, steer.ErrForeignProgram)
	require.Nil(t, dp)
	require.Zero(t, xdpProgID(t, "dpa"), "left attached after a failed Open")
	require.Equal(t, foreign, xdpProgID(t, "dpb"), "the foreign program must stay")

	// Other failing steps: a missing interface, more queues than it has.
	for _, bad := range []Interface{{Name: "dpnone"}, {Name: "dpb", Queues: 2}} {
		s := spec
		s.Interfaces = []Interface{spec.Interfaces[0], bad}
		_, err := Open(s, nil)
		require.Error(t, err, "%s", bad.Name)
		require.Zero(t, xdpProgID(t, "dpa"))
	}

	spec.Interfaces = spec.Interfaces[:1]
	dp, err = Open(spec, nil)
	require.NoError(t, err, "the queues of dpa must be free again")
	require.NoError(t, dp.Close())
}

// TestOpenBeside: a build beside a running data path that fails leaves
// the running one attached with its rules; one that succeeds shares the
// interfaces both serve (same program, same sockets, never detached) and,
// after TakeOver, releases what only the old one served.
func TestOpenBeside(t *testing.T) {
	netlab.EnterNetns(t)
	veth(t, "dpup", 1)
	veth(t, "dpvm1", 1)
	veth(t, "dpvm2", 1)
	run, err := Open(Spec{Interfaces: []Interface{{Name: "dpup", Steer: rulesA}, {Name: "dpvm1"}},
		SlowPath: true, Pipeline: nopPipeline}, nil)
	require.NoError(t, err)
	upProg := xdpProgID(t, "dpup")
	vm1Prog := xdpProgID(t, "dpvm1")
	runLinks := run.Links()

	// A new VM port with a foreign program: refused, run untouched, its
	// rules too.
	foreign := foreignXDP(t, "dpvm2")
	next := Spec{Interfaces: []Interface{{Name: "dpup", Steer: rulesB}, {Name: "dpvm2", DropNoSocket: true}},
		SlowPath: true, Pipeline: nopPipeline}
	failed, err := Open(next, run)
	require.ErrorIs(t, err, steer.ErrForeignProgram)
	require.Nil(t, failed)
	require.Equal(t, upProg, xdpProgID(t, "dpup"))
	require.Equal(t, vm1Prog, xdpProgID(t, "dpvm1"))
	require.Equal(t, foreign, xdpProgID(t, "dpvm2"))
	require.Equal(t, rulesA.Normalize(), runLinks[0].Program.Config(), "the running rules must come back")

	// Without it, the build succeeds beside run.
	removeXDP(t, "dpvm2")
	dp, err := Open(next, run)
	require.NoError(t, err)
	links := dp.Links()
	require.Same(t, runLinks[0].Program, links[0].Program, "a shared interface keeps its program")
	require.Same(t, runLinks[0].Sockets[0], links[0].Sockets[0], "and its sockets")
	require.Equal(t, rulesB.Normalize(), links[0].Program.Config())
	require.NotSame(t, run.SlowPath(), dp.SlowPath(), "each data path has its own slow path")
	require.Error(t, dp.Close(), "built beside: TakeOver or Discard")

	dp.TakeOver()
	require.Equal(t, upProg, xdpProgID(t, "dpup"), "never detached")
	require.Zero(t, xdpProgID(t, "dpvm1"), "only the old data path served it")
	require.NotZero(t, xdpProgID(t, "dpvm2"))

	// An interface recreated under the running data path cannot be shared.
	require.NoError(t, netlink.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "dpvm2"}}))
	veth(t, "dpvm2", 1)
	_, err = Open(next, dp)
	require.ErrorIs(t, err, ErrInterfaceChanged)
	require.Equal(t, upProg, xdpProgID(t, "dpup"))

	require.NoError(t, dp.Close())
	require.Zero(t, xdpProgID(t, "dpup"))
}

// TestOpenBesideTouchesRunningLast: while Open builds beside a running
// data path, the running one's shared programs keep its rules until
// everything only the new spec serves is built and attached; a build that
// fails there (a foreign program on a new interface) never changed them.
// Each Spec.Pipeline call (step 4, after the new interface's sockets are
// open) records the rules the running data path steers by then.
func TestOpenBesideTouchesRunningLast(t *testing.T) {
	netlab.EnterNetns(t)
	veth(t, "dplup", 1)
	veth(t, "dplvm1", 1)
	run, err := Open(Spec{Interfaces: []Interface{{Name: "dplup", Steer: rulesA}}, SlowPath: true, Pipeline: nopPipeline}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = run.Close() })
	prog := run.Links()[0].Program

	tests := []struct {
		name    string
		foreign bool // a foreign XDP program on the new interface
	}{
		{"build fails", true},
		{"build succeeds", false},
	}
	for _, tt := range tests {
		if tt.foreign {
			foreignXDP(t, "dplvm1")
		} else {
			removeXDP(t, "dplvm1")
		}
		var seen []steer.Config
		next := Spec{Interfaces: []Interface{{Name: "dplup", Steer: rulesB}, {Name: "dplvm1"}}, SlowPath: true,
			Pipeline: func(Input) (*engine.Pipeline, error) {
				seen = append(seen, prog.Config())
				return engine.NewPipeline(), nil
			}}
		dp, err := Open(next, run)
		require.NotEmpty(t, seen, tt.name)
		for _, c := range seen {
			require.Equal(t, rulesA.Normalize(), c, "%s: the running data path's rules changed while the new one was built", tt.name)
		}
		if tt.foreign {
			require.ErrorIs(t, err, steer.ErrForeignProgram, tt.name)
			require.Equal(t, rulesA.Normalize(), prog.Config(), tt.name)
			continue
		}
		require.NoError(t, err, tt.name)
		require.Equal(t, rulesB.Normalize(), prog.Config(), "%s: the new rules, once built", tt.name)
		require.NoError(t, dp.Discard())
		require.Equal(t, rulesA.Normalize(), prog.Config(), "%s: discarded", tt.name)
	}
}
