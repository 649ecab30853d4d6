// Command l2fwd is the smallest useful xdplb data plane: it forwards every
// frame arriving on one interface out of another (or back out of the same
// one) through the engine's AF_XDP ports and an otherwise empty pipeline,
// rewriting only the Ethernet addresses. It is the raw I/O ceiling the
// end-to-end packet-rate harness compares the Mux and the Host Agent with.
//
//	l2fwd -in veth0 -out veth1 -dst-mac 02:00:00:00:00:02
//
// The in interface gets the steering program in "steer all" mode: every
// frame on it, ARP included, belongs to l2fwd. Run it as root, in the
// network namespace that holds the interfaces. It runs one worker per RX
// queue of the in interface, pinned to an OS thread, until SIGINT/SIGTERM.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/xdplb/xdplb/engine"
	"github.com/xdplb/xdplb/engine/afxdp"
	"github.com/xdplb/xdplb/engine/steer"
	"github.com/xdplb/xdplb/header"
)

type options struct {
	in, out  string
	dstMAC   string
	queues   int
	ring     afxdp.Ring
	bind     afxdp.BindMode
	xdpMode  steer.AttachMode
	frames   int
	spins    int
	stats    time.Duration
	duration time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.in, "in", "", "interface to receive from (required)")
	flag.StringVar(&o.out, "out", "", "interface to send on (default: the in interface, reflecting)")
	flag.StringVar(&o.dstMAC, "dst-mac", "", "destination MAC written into forwarded frames (default: keep it)")
	flag.IntVar(&o.queues, "queues", 0, "RX queues to serve (default: all of the in interface)")
	flag.TextVar(&o.ring, "ring", afxdp.RingOwn, "ring implementation: own or asavie")
	flag.TextVar(&o.bind, "bind", afxdp.BindAuto, "AF_XDP bind mode: auto, copy or zerocopy")
	flag.TextVar(&o.xdpMode, "xdp-mode", steer.AttachAuto, "XDP attach mode: auto, driver or generic")
	flag.IntVar(&o.frames, "frames", 4096, "UMEM frames per queue")
	flag.IntVar(&o.spins, "spin", 0, "empty polls before an idle worker sleeps in poll(2) (0: sleep at once; higher trades CPU for latency)")
	flag.DurationVar(&o.stats, "stats", time.Second, "interval between rate lines on stderr (0: none)")
	flag.DurationVar(&o.duration, "duration", 0, "stop after this long (0: run until signalled)")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(o, log); err != nil {
		log.Error("l2fwd failed", "err", err)
		os.Exit(1)
	}
}

func run(o options, log *slog.Logger) error {
	if o.in == "" {
		return errors.New("-in is required")
	}
	if o.out == "" {
		o.out = o.in
	}
	var dst header.MAC
	if o.dstMAC != "" {
		hw, err := net.ParseMAC(o.dstMAC)
		if err != nil || len(hw) != 6 {
			return fmt.Errorf("-dst-mac %q: not an Ethernet MAC address", o.dstMAC)
		}
		copy(dst[:], hw)
	}
	ring, bind, mode := o.ring, o.bind, o.xdpMode
	inIf, err := net.InterfaceByName(o.in)
	if err != nil {
		return fmt.Errorf("-in: %w", err)
	}
	outIf, err := net.InterfaceByName(o.out)
	if err != nil {
		return fmt.Errorf("-out: %w", err)
	}
	var src header.MAC
	copy(src[:], outIf.HardwareAddr)

	queues := o.queues
	if queues == 0 {
		if queues, err = afxdp.QueueCount(o.in); err != nil {
			return err
		}
	}

	prog, err := steer.Load(steer.Options{})
	if err != nil {
		return fmt.Errorf("load the steering program: %w", err)
	}
	defer prog.Close()
	if err := prog.SetSteerAll(true); err != nil {
		return err
	}

	reflect := o.in == o.out
	var ports []engine.Port
	defer func() {
		for _, p := range ports {
			_ = p.Close()
		}
	}()
	var workers []*engine.Worker
	for q := 0; q < queues; q++ {
		cfg := afxdp.Config{Name: fmt.Sprintf("%s:%d", o.in, q), Interface: o.in, Queue: q,
			NumFrames: o.frames, Ring: ring, Mode: bind}
		rx, err := afxdp.Open(cfg)
		if err != nil {
			return fmt.Errorf("open %s queue %d: %w", o.in, q, err)
		}
		ports = append(ports, rx)
		if err := prog.RegisterSocket(q, rx.FD()); err != nil {
			return err
		}
		wports := []engine.Port{rx}
		out := uint16(0)
		if !reflect {
			cfg.Name, cfg.Interface = fmt.Sprintf("%s:%d", o.out, q), o.out
			tx, err := afxdp.Open(cfg)
			if err != nil {
				return fmt.Errorf("open %s queue %d: %w", o.out, q, err)
			}
			ports = append(ports, tx)
			wports = append(wports, tx)
			out = 1
		}
		pl := engine.NewPipeline(forward(src, dst, o.dstMAC != "", out))
		w, err := engine.NewWorker(engine.WorkerConfig{ID: q, Ports: wports, IdleSpins: o.spins,
			Inputs: []engine.Input{{Port: 0, Pipeline: pl}}})
		if err != nil {
			return err
		}
		workers = append(workers, w)
	}
	// Attach last: frames flow only once every socket is registered.
	if err := prog.Attach(inIf.Index, mode); err != nil {
		return fmt.Errorf("attach to %s: %w", o.in, err)
	}
	eng, err := engine.New(workers...)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if o.duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.duration)
		defer cancel()
	}
	log.Info("forwarding", "in", o.in, "out", o.out, "queues", queues, "ring", ring, "bind", o.bind)
	done := make(chan error, 1)
	go func() { done <- eng.Run(ctx) }()

	start := time.Now()
	var tick <-chan time.Time
	if o.stats > 0 {
		t := time.NewTicker(o.stats)
		defer t.Stop()
		tick = t.C
	}
	last, lastAt := eng.Stats(), start
	for {
		select {
		case err := <-done:
			s := eng.Stats()
			secs := time.Since(start).Seconds()
			fmt.Printf("rx %d tx %d dropped %d %v in %.1fs (%.0f pps forwarded)\n",
				s.RX, s.TX, s.Dropped(), s.DropsByName(), secs, float64(s.TX)/secs)
			return err
		case now := <-tick:
			s := eng.Stats()
			secs := now.Sub(lastAt).Seconds()
			fmt.Fprintf(os.Stderr, "rx %.0f pps, tx %.0f pps, drops %v\n",
				float64(s.RX-last.RX)/secs, float64(s.TX-last.TX)/secs, s.DropsByName())
			last, lastAt = s, now
		}
	}
}

var dropRunt = engine.DropTruncated

// forward is l2fwd's one stage: Ethernet source = the out interface,
// destination = -dst-mac when given, out port = out.
func forward(src, dst header.MAC, setDst bool, out uint16) engine.Stage {
	return engine.StageFunc(func(b *engine.Batch) {
		for _, p := range b.Packets() {
			d := p.Data()
			if len(d) < header.EthernetSize {
				b.Drop(p, dropRunt)
				continue
			}
			eth := header.Ethernet(d)
			eth.SetSrc(src)
			if setDst {
				eth.SetDst(dst)
			}
			p.OutPort = out
		}
	})
}
