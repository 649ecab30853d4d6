//go:build linux

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/xdplb/xdplb/internal/lab/netlab"
	"github.com/xdplb/xdplb/internal/lab/pktrate"
)

// procFlags collects repeated -proc label=command flags.
type procFlags []pktrate.Process

func (p *procFlags) String() string { return fmt.Sprint(len(*p), " programs") }

func (p *procFlags) Set(v string) error {
	label, cmdline, ok := strings.Cut(v, "=")
	f := strings.Fields(cmdline)
	if !ok || label == "" || len(f) == 0 {
		return errors.New(`want label=program args..., e.g. mux=/tmp/mux -in {in} -out {out}`)
	}
	*p = append(*p, pktrate.Process{Label: label, Path: f[0], Args: f[1:]})
	return nil
}

func main() {
	os.Exit(run())
}

func run() int {
	var (
		duts      = flag.String("duts", "xdp-redirect,kernel,l2fwd", "DUT modes to compare, in order (the first is the ratio reference), all of one path: routed: xdp-redirect, kernel, l2fwd; one-arm: mux, l2fwd-1arm, kernel-1arm, xdp-tx-1arm; tunnel: hostagent, kernel-vxlan-dnat; or a -proc label")
		sizes     = flag.String("size", "64", "frame sizes with FCS, 64..1518, comma-separated")
		flows     = flag.String("flows", "1,1k", "flow counts (1..2M), comma-separated, k/M suffixes")
		loads     = flag.String("load", "max", "offered loads in packets/s (k/M suffixes) or max, comma-separated")
		duration  = flag.Duration("duration", 2*time.Second, "measurement window per trial")
		warmup    = flag.Duration("warmup", 500*time.Millisecond, "warm-up before each window")
		trials    = flag.Int("trials", 5, "trials per DUT and point (figures are medians)")
		genCPU    = flag.String("gen-cpu", "", "pin the generator's sending thread to these CPUs (comma-separated)")
		dutCPU    = flag.String("dut-cpu", "", "pin the DUT's ingress NAPI threads to these CPUs (threaded NAPI only)")
		sinkCPU   = flag.String("sink-cpu", "", "pin the sink's NAPI threads to these CPUs (threaded NAPI only)")
		napi      = flag.String("napi", "threaded-fifo", "where the DUT's and the sink's kernel receive work runs: threaded-fifo, threaded (DUT at normal priority) or softirq (DUT CPU is then /proc/stat softirq time, an upper bound)")
		queues    = flag.Int("queues", 1, "queues per veth")
		l2fwdBin  = flag.String("l2fwd-bin", "", "prebuilt examples/l2fwd binary (default: go build ./examples/l2fwd)")
		l2fwdArgs = flag.String("l2fwd-args", "-in {in} -out {out} -dst-mac {next_mac}", "l2fwd arguments; {in} {out} {in_mac} {out_mac} {next_mac} {next_ip} are replaced")
		muxBin    = flag.String("mux-bin", "", "prebuilt examples/mux binary (default: go build ./examples/mux)")
		muxArgs   = flag.String("mux-args", "", "extra mux arguments (the harness passes -interface, -config, -log-level, -metrics 127.0.0.1:9109, -conns)")
		haBin     = flag.String("hostagent-bin", "", "prebuilt examples/hostagent binary (default: go build ./examples/hostagent)")
		haArgs    = flag.String("hostagent-args", "", "extra hostagent arguments (the harness passes -uplink, -host, -config, -log-level, -conns)")
		conns     = flag.String("conns", "auto", "connection table capacity of mux and NAT table capacity of hostagent (k/M suffixes); auto: 1M, or the largest -flows rounded up to a power of two if larger")
		ctMax     = flag.String("conntrack-max", "", "for kernel-vxlan-dnat: raise the machine's net.netfilter.nf_conntrack_max and nf_conntrack_buckets to this (k/M suffixes) for the run, and restore them after (a global setting: it is read-only inside namespaces); empty: leave them")
		procPath  = flag.String("proc-path", "routed", "path of the -proc modes: routed, one-arm or tunnel")
		procOut   = flag.String("proc-output", "plain", "what the -proc modes deliver to the sink: plain or vxlan")
		procFIFO  = flag.Bool("proc-fifo", false, "run the threads of process DUTs (l2fwd, mux, hostagent, -proc) SCHED_FIFO at the DUT NAPI threads' priority, so a busy machine's other processes cannot delay them more than the kernel modes' NAPI threads")
		prefix    = flag.String("prefix", "pktrate", "namespace name prefix")
		procs     procFlags
	)
	flag.Var(&procs, "proc", "extra DUT mode run as a program in the DUT namespace: label=program args... (placeholders as in -l2fwd-args); repeatable")
	flag.Parse()

	cfg := pktrate.Config{
		Duration: *duration, Warmup: *warmup, Trials: *trials, ProcessFIFO: *procFIFO,
		Topology: pktrate.TopologyConfig{Queues: *queues},
		Progress: func(p pktrate.Point, trial int, s pktrate.Sample) {
			fastPath := ""
			if f := s.FastPath; f != nil {
				fastPath = fmt.Sprintf("; fast path %+v", *f)
			}
			fmt.Fprintf(os.Stderr, "%-12s %4dB %7d flows load %-5v trial %d: offered %.3f, delivered %.3f, forwarded %.3f Mpps; loss %.2f%% (in %.2f%%, out %.2f%%); DUT %.0f ns/pkt; CPU dut %.2f gen %.2f sink %.2f; busy %d; drops %+v%s\n",
				p.DUT, p.Size, p.Flows, p.Load, trial+1, s.OfferedPPS()/1e6, s.DeliveredPPS()/1e6, s.ForwardedPPS()/1e6,
				s.Loss()*100, s.IngressLoss()*100, s.EgressLoss()*100, float64(s.CPUPerPacket().Nanoseconds()),
				s.Utilisation(s.DUTCPU), s.Utilisation(s.GenCPU), s.Utilisation(s.SinkCPU), s.Busy, s.Drops, fastPath)
		},
	}
	var err error
	if cfg.Sizes, err = parseList(*sizes, strconv.Atoi); err != nil {
		return fail(err)
	}
	if cfg.Flows, err = parseList(*flows, pktrate.ParseCount); err != nil {
		return fail(err)
	}
	if cfg.Loads, err = parseList(*loads, pktrate.ParseLoad); err != nil {
		return fail(err)
	}
	if cfg.Topology.NAPI, err = pktrate.ParseNAPIMode(*napi); err != nil {
		return fail(err)
	}
	for _, c := range []struct {
		flag string
		dst  *[]int
	}{{*genCPU, &cfg.GenAffinity}, {*dutCPU, &cfg.Topology.DUTNAPICPUs}, {*sinkCPU, &cfg.Topology.SinkNAPICPUs}} {
		if c.flag != "" {
			if *c.dst, err = parseList(c.flag, strconv.Atoi); err != nil {
				return fail(err)
			}
		}
	}

	var pp pktrate.Path
	switch *procPath {
	case "routed":
	case "one-arm":
		pp = pktrate.PathOneArm
	case "tunnel":
		pp = pktrate.PathTunnel
	default:
		return fail(fmt.Errorf("-proc-path %q: want routed, one-arm or tunnel", *procPath))
	}
	var po pktrate.Output
	switch *procOut {
	case "plain":
	case "vxlan":
		po = pktrate.OutputVXLAN
	default:
		return fail(fmt.Errorf("-proc-output %q: want plain or vxlan", *procOut))
	}
	for i := range procs {
		procs[i].On, procs[i].Delivers = pp, po
	}
	capacity := 1 << 20
	if *conns == "auto" {
		for _, f := range cfg.Flows {
			for capacity < f {
				capacity *= 2
			}
		}
	} else if capacity, err = pktrate.ParseCount(*conns); err != nil {
		return fail(fmt.Errorf("-conns: %w", err))
	}

	tmp, err := os.MkdirTemp("", "pktrate-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(tmp)
	// binary returns the prebuilt binary, or builds the package once.
	built := map[string]string{}
	binary := func(given, pkg string) (string, error) {
		if given != "" {
			return given, nil
		}
		if b, ok := built[pkg]; ok {
			return b, nil
		}
		b, err := build(tmp, pkg)
		built[pkg] = b
		return b, err
	}
	kernelNAT := false
	for _, name := range strings.Split(*duts, ",") {
		switch name = strings.TrimSpace(name); name {
		case "xdp-redirect", "xdp-tx-1arm":
			cfg.DUTs = append(cfg.DUTs, pktrate.XDPRedirect{OneArm: name == "xdp-tx-1arm"})
		case "kernel", "kernel-1arm":
			cfg.DUTs = append(cfg.DUTs, pktrate.KernelForward{OneArm: name == "kernel-1arm"})
		case "l2fwd", "l2fwd-1arm":
			bin, err := binary(*l2fwdBin, "./examples/l2fwd")
			if err != nil {
				return fail(err)
			}
			p := pktrate.Process{Label: name, Path: bin, Args: strings.Fields(*l2fwdArgs)}
			if name == "l2fwd-1arm" {
				p.On = pktrate.PathOneArm // {out} is {in}: l2fwd reflects
			}
			cfg.DUTs = append(cfg.DUTs, p)
		case "mux":
			bin, err := binary(*muxBin, "./examples/mux")
			if err != nil {
				return fail(err)
			}
			cfg.DUTs = append(cfg.DUTs, pktrate.Mux{Bin: bin, Args: strings.Fields(*muxArgs), Conns: capacity})
		case "hostagent":
			bin, err := binary(*haBin, "./examples/hostagent")
			if err != nil {
				return fail(err)
			}
			cfg.DUTs = append(cfg.DUTs, pktrate.HostAgent{Bin: bin, Args: strings.Fields(*haArgs), Conns: capacity})
		case "kernel-vxlan-dnat":
			cfg.DUTs = append(cfg.DUTs, pktrate.KernelVXLANDNAT{})
			kernelNAT = true
		default:
			found := false
			for _, p := range procs {
				if p.Label == name {
					cfg.DUTs, found = append(cfg.DUTs, p), true
				}
			}
			if !found {
				return fail(fmt.Errorf("unknown DUT mode %q (define it with -proc %s=program args...)", name, name))
			}
		}
	}

	if *ctMax != "" {
		n, err := pktrate.ParseCount(*ctMax)
		if err != nil {
			return fail(fmt.Errorf("-conntrack-max: %w", err))
		}
		restore, err := raiseConntrack(n)
		if err != nil {
			return fail(err)
		}
		defer restore()
	}
	if kernelNAT {
		if max, err := readInt(conntrackMax); err == nil {
			for _, f := range cfg.Flows {
				if f > max {
					fmt.Fprintf(os.Stderr, "pktrate: warning: %d flows exceed nf_conntrack_max (%d): kernel-vxlan-dnat will drop new flows; pass -conntrack-max %d to raise it for the run\n", f, max, 2*f)
					break
				}
			}
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := netlab.CleanupStale(*prefix); err != nil {
		fmt.Fprintln(os.Stderr, "pktrate: removing stale namespaces:", err)
	}
	lab, err := netlab.NewStandalone(*prefix)
	if err != nil {
		return fail(err)
	}
	defer lab.Close()

	start := time.Now()
	results, err := pktrate.Run(ctx, lab, cfg)
	if len(results) > 0 {
		fmt.Printf("\npktrate %s\n\n%d trials of %v (+%v warm-up) per row; figures are medians.\n\n",
			strings.Join(os.Args[1:], " "), cfg.Trials, cfg.Duration, cfg.Warmup)
		_ = pktrate.WriteTable(os.Stdout, results)
		fmt.Fprintf(os.Stderr, "total %v\n", time.Since(start).Round(time.Second))
	}
	if err != nil {
		return fail(err)
	}
	return 0
}

// The machine's connection tracking limits (writable only in the initial
// network namespace).
const (
	conntrackMax     = "/proc/sys/net/netfilter/nf_conntrack_max"
	conntrackBuckets = "/proc/sys/net/netfilter/nf_conntrack_buckets"
)

// raiseConntrack raises nf_conntrack_max and nf_conntrack_buckets to at
// least n and returns a function that restores what they were.
func raiseConntrack(n int) (restore func(), err error) {
	var undo []func()
	restore = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	for _, f := range []string{conntrackMax, conntrackBuckets} {
		old, err := readInt(f)
		if err != nil {
			restore()
			return nil, fmt.Errorf("-conntrack-max: %w", err)
		}
		if old >= n {
			continue
		}
		if err := os.WriteFile(f, []byte(strconv.Itoa(n)), 0o644); err != nil {
			restore()
			return nil, fmt.Errorf("-conntrack-max: %w", err)
		}
		fmt.Fprintf(os.Stderr, "pktrate: %s raised from %d to %d for the run\n", filepath.Base(f), old, n)
		undo = append(undo, func() {
			if err := os.WriteFile(f, []byte(strconv.Itoa(old)), 0o644); err != nil {
				fmt.Fprintf(os.Stderr, "pktrate: restoring %s to %d: %v\n", f, old, err)
			}
		})
	}
	return restore, nil
}

func readInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// build compiles a package of this module into dir and returns the binary.
func build(dir, pkg string) (string, error) {
	if _, err := os.Stat(pkg); err != nil {
		return "", fmt.Errorf("%s not found (run from the repository root, or pass the mode's -*-bin flag, or drop it from -duts): %w", pkg, err)
	}
	out := filepath.Join(dir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build %s: %w", pkg, err)
	}
	return out, nil
}

func parseList[T any](s string, parse func(string) (T, error)) ([]T, error) {
	var out []T
	for _, f := range strings.Split(s, ",") {
		v, err := parse(strings.TrimSpace(f))
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

func fail(err error) int {
	msg := err.Error()
	if !strings.HasPrefix(msg, "pktrate:") {
		msg = "pktrate: " + msg
	}
	fmt.Fprintln(os.Stderr, msg)
	return 1
}
