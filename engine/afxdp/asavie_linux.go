//go:build linux

package afxdp

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"github.com/asavie/xdp"
	"golang.org/x/sys/unix"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/internal/prefetch"
	"github.com/xdplb/xdplb/internal/xsk"
)

// asavieSock adapts github.com/asavie/xdp's Socket, used as it is, to the
// Port contract (RingAsavie). asavie marks a chunk free as soon as it is
// received, so chunks the worker still holds are tracked here and skipped
// when asavie hands out "free" chunks for the fill ring or for TX copies.
type asavieSock struct {
	x    *xdp.Socket
	umem []byte
	fs   uint64
	mask uint64

	held  []bool // by chunk index: in a packet the worker holds
	nheld int

	txDescs []xdp.Desc // Transmit scratch
	spare   []xdp.Desc // free chunks minus held ones
	txSize  int

	rings [][2]uintptr // the rings' mappings (address, length), for close
}

// asavieFlagsMu serialises asavie's package-level bind flags.
var asavieFlagsMu sync.Mutex

func openAsavie(cfg Config, ifindex int) (*asavieSock, error) {
	var flags uint16
	switch cfg.Mode {
	case BindCopy:
		flags = unix.XDP_COPY
	case BindZeroCopy:
		flags = unix.XDP_ZEROCOPY
	}
	asavieFlagsMu.Lock()
	xdp.DefaultSocketFlags = flags
	x, err := xdp.NewSocket(ifindex, cfg.Queue, &xdp.SocketOptions{
		NumFrames:              cfg.NumFrames,
		FrameSize:              cfg.FrameSize,
		FillRingNumDescs:       cfg.FillRingSize,
		CompletionRingNumDescs: cfg.CompletionRingSize,
		RxRingNumDescs:         cfg.RXRingSize,
		TxRingNumDescs:         cfg.TXRingSize,
	})
	xdp.DefaultSocketFlags = 0
	asavieFlagsMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("afxdp: asavie: %w", err)
	}
	rings, err := socketMappings(x.FD())
	if err != nil {
		_ = x.Close()
		return nil, fmt.Errorf("afxdp: asavie: %w", err)
	}
	// The copy-mode TX budget is a kernel setting, not ring code: raise it
	// as for RingOwn so both are measured alike.
	_ = unix.SetsockoptInt(x.FD(), unix.SOL_XDP, xsk.OptMaxTXSkbBudget, cfg.TXRingSize)
	total := cfg.NumFrames * cfg.FrameSize
	a := &asavieSock{
		x:       x,
		umem:    x.GetFrame(xdp.Desc{Addr: 0, Len: uint32(total)}),
		fs:      uint64(cfg.FrameSize),
		mask:    uint64(cfg.FrameSize - 1),
		held:    make([]bool, cfg.NumFrames),
		txDescs: make([]xdp.Desc, 0, cfg.TXRingSize),
		spare:   make([]xdp.Desc, 0, max(cfg.TXRingSize, cfg.FillRingSize)),
		txSize:  cfg.TXRingSize,
		rings:   rings,
	}
	return a, nil
}

// socketMappings returns the address ranges mapped from socket fd (asavie
// maps the four rings and keeps no handle to unmap them with).
func socketMappings(fd int) ([][2]uintptr, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("fstat: %w", err)
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return nil, err
	}
	name := "socket:[" + strconv.FormatUint(st.Ino, 10) + "]"
	var out [][2]uintptr
	for _, line := range strings.Split(string(maps), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || f[5] != name {
			continue
		}
		lo, hi, _ := strings.Cut(f[0], "-")
		a, err1 := strconv.ParseUint(lo, 16, 64)
		b, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || b <= a {
			return nil, fmt.Errorf("/proc/self/maps: bad range %q", f[0])
		}
		out = append(out, [2]uintptr{uintptr(a), uintptr(b - a)})
	}
	return out, nil
}

// freeDescs returns up to n chunks asavie considers free, minus the held
// ones.
func (a *asavieSock) freeDescs(n int) []xdp.Desc {
	descs := a.x.GetDescs(n + a.nheld)
	if a.nheld == 0 {
		return descs[:min(n, len(descs))]
	}
	out := a.spare[:0]
	for _, d := range descs {
		if len(out) == n {
			break
		}
		if !a.held[d.Addr/a.fs] {
			out = append(out, d)
		}
	}
	return out
}

func (a *asavieSock) fillUp() {
	if n := a.x.NumFreeFillSlots(); n > 0 {
		a.x.Fill(a.freeDescs(n))
	}
}

func (a *asavieSock) receive(p *Port, b *engine.Batch, pool []engine.Packet, inPort uint16) int {
	want := min(b.Cap(), len(pool))
	if want <= 0 {
		return 0
	}
	descs := a.x.Receive(want)
	fs := a.fs
	var bytes uint64
	for i, d := range descs {
		base := d.Addr &^ a.mask
		prefetch.Frame(unsafe.Pointer(&a.umem[d.Addr]))
		pk := &pool[i]
		pk.SetBuffer(p, base, a.umem[base:base+fs:base+fs], int(d.Addr-base), int(d.Len), inPort)
		b.Append(pk)
		a.held[base/fs] = true
		bytes += uint64(d.Len)
	}
	a.nheld += len(descs)
	p.c[cRXFrames] += uint64(len(descs))
	p.c[cRXBytes] += bytes
	return len(descs)
}

func (a *asavieSock) transmit(p *Port, pkts []*engine.Packet) int {
	if len(pkts) == 0 {
		return 0
	}
	fs := a.fs
	foreign := 0
	for _, pk := range pkts {
		if o, _ := pk.Owner(); o != engine.Port(p) {
			foreign++
		}
	}
	var spare []xdp.Desc
	if foreign > 0 {
		spare = a.freeDescs(foreign)
	}
	descs := a.txDescs[:0]
	last := len(pkts)
	i, si := 0, 0
	var bytes uint64
	noFrame := false
	for i < last && len(descs) < cap(descs) {
		pk := pkts[i]
		n := pk.Len()
		owner, frame := pk.Owner()
		if n <= 0 || uint64(n) > fs {
			last--
			pkts[i], pkts[last] = pkts[last], pkts[i]
			pkts[last].Reason = engine.DropTXTooBig
			p.c[cTXTooBig]++
			continue
		}
		if owner == engine.Port(p) {
			descs = append(descs, xdp.Desc{Addr: frame + uint64(pk.Headroom()), Len: uint32(n)})
		} else {
			if si == len(spare) {
				noFrame = true
				break
			}
			base := spare[si].Addr
			si++
			off := min(p.copyOff, fs-uint64(n))
			copy(a.umem[base+off:base+off+uint64(n)], pk.Data())
			descs = append(descs, xdp.Desc{Addr: base + off, Len: uint32(n)})
			p.c[cTXCopied]++
		}
		bytes += uint64(n)
		i++
	}
	k := a.kick(p, descs) // one sendto per call, as asavie does
	p.c[cTXKicks]++
	for _, pk := range pkts[:k] {
		if owner, frame := pk.Owner(); owner == engine.Port(p) {
			pk.MarkSent()
			a.held[frame/fs] = false
			a.nheld--
		}
	}
	p.c[cTXFrames] += uint64(k)
	if k < i {
		for _, d := range descs[k:] {
			bytes -= uint64(d.Len)
		}
	}
	p.c[cTXBytes] += bytes
	p.c[cTXRingFull] += uint64(i - k) // refused by asavie: no TX ring slot
	p.refuseRest(pkts, i, last, noFrame)
	return k
}

// kick is asavie's Transmit (descs onto the TX ring, then a sendto), but
// for its panic: asavie panics when sendto fails with anything but
// EINTR, EAGAIN or EBUSY — ENETDOWN once the interface is gone, ENOBUFS
// under pressure — where RingOwn counts the error and goes on (Check
// finds a port whose interface is gone). The descriptors are on the ring
// before the sendto, so kick returns how many went there either way; a
// failure that is not transient is counted as a kick error. Any other
// panic is asavie's own and goes on.
func (a *asavieSock) kick(p *Port, descs []xdp.Desc) (k int) {
	k = min(len(descs), a.x.NumFreeTxSlots())
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		e, ok := asavieSendtoErrno(r)
		if !ok {
			panic(r)
		}
		if !transientKickErr(e) {
			p.c[cKickErrors]++
		}
	}()
	return a.x.Transmit(descs)
}

// asavieSendtoErrno returns the errno of the panic asavie's Transmit
// raises when sendto fails ("sendto failed with rc=%d and errno=%d"),
// or false for any other panic value.
func asavieSendtoErrno(r any) (unix.Errno, bool) {
	err, ok := r.(error)
	if !ok {
		return 0, false
	}
	msg := err.Error()
	const prefix, field = "sendto failed with rc=", " and errno="
	i := strings.LastIndex(msg, field)
	if !strings.HasPrefix(msg, prefix) || i < 0 {
		return 0, false
	}
	n, perr := strconv.Atoi(msg[i+len(field):])
	if perr != nil {
		return 0, false
	}
	return unix.Errno(n), true
}

func (a *asavieSock) release(p *Port, pkts []*engine.Packet) {
	for _, pk := range pkts {
		owner, frame := pk.Owner()
		if owner != engine.Port(p) || pk.Sent() {
			continue
		}
		if idx := frame / a.fs; a.held[idx] {
			a.held[idx] = false
			a.nheld--
		}
	}
}

func (a *asavieSock) flush(p *Port) {
	if a.x.NumTransmitted() > 0 {
		// Entries the kernel has not consumed yet: kick once more.
		if a.x.NumFreeTxSlots() < a.txSize {
			a.kick(p, nil)
			p.c[cTXKicks]++
		}
		if n := a.x.NumCompleted(); n > 0 {
			a.x.Complete(n)
			p.c[cCompleted] += uint64(n)
		}
	}
	a.fillUp()
}

func (a *asavieSock) frames(p *Port) Frames {
	f := Frames{Kernel: a.x.NumFilled(), Held: a.nheld, TX: a.x.NumTransmitted()}
	f.Free = p.cfg.NumFrames - f.Kernel - f.Held - f.TX
	return f
}

// close closes the socket and unmaps the rings, which asavie's Close
// leaves mapped: a mapping holds the socket, which would stay bound to
// its queue (a new socket there fails with EBUSY) and keep its UMEM
// pinned.
func (a *asavieSock) close() error {
	err := a.x.Close()
	for _, m := range a.rings {
		if _, _, e := unix.Syscall(unix.SYS_MUNMAP, m[0], m[1], 0); e != 0 && err == nil {
			err = fmt.Errorf("afxdp: asavie: munmap ring: %w", e)
		}
	}
	a.rings = nil
	return err
}
