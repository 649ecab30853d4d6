//go:build linux

package pktrate

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
)

// Mux is the DUT mode "mux": xdplb's Mux (examples/mux, or any program
// taking its flags) on PathOneArm. Start writes MuxDocument into a
// temporary file and runs
//
//	Bin -interface {in} -config <document> -log-level warn -metrics MuxMetricsAddr [-conns Conns] Args...
//
// in the DUT namespace (as Process: it is ready when its XDP program is
// on the veth). The Mux encapsulates the test frames to the VIP in VXLAN
// towards MuxBackends' hosts, which it reaches through the generator,
// back out of the veth they came in on. Its Instance is a
// FastPathReader: it scrapes the program's /metrics at MuxMetricsAddr
// from inside the DUT namespace, so the program must serve the Mux's
// fast-path counters there (an Args "-metrics" elsewhere fails the
// trial).
type Mux struct {
	// Label names the mode (default "mux").
	Label string
	// Bin is the program; Args extra argument templates (Process
	// placeholders); Env extra environment.
	Bin  string
	Args []string
	Env  []string
	// Conns is the connection table's capacity (-conns; 0: the
	// program's default).
	Conns int
}

// Name returns the Label, "mux" by default.
func (m Mux) Name() string { return orDefault(m.Label, "mux") }

// Shape returns PathOneArm and OutputVXLAN.
func (Mux) Shape() (Path, Output) { return PathOneArm, OutputVXLAN }

// Start writes the document and starts the Mux.
func (m Mux) Start(ctx context.Context, t *Topology) (Instance, error) {
	args := []string{"-interface", "{in}", "-config", "", "-log-level", "warn", "-metrics", MuxMetricsAddr}
	if m.Conns > 0 {
		args = append(args, "-conns", strconv.Itoa(m.Conns))
	}
	inst, err := startWithDocument(ctx, t, m, MuxDocument(), Process{Label: m.Name(), Path: m.Bin,
		Args: append(args, m.Args...), Env: m.Env, On: PathOneArm, Delivers: OutputVXLAN})
	if err != nil {
		return nil, err
	}
	return newMuxInstance(inst, t.DUT, MuxMetricsAddr), nil
}

// HostAgent is the DUT mode "hostagent": xdplb's Host Agent
// (examples/hostagent, or any program taking its flags) on PathTunnel.
// Start writes HostAgentDocument for the topology's VM (the sink's MAC
// behind the VM port DUTOut) into a temporary file and runs
//
//	Bin -uplink {in} -host dut -config <document> -log-level warn [-conns Conns] Args...
//
// in the DUT namespace. The agent decapsulates the VXLAN arriving on its
// uplink, translates VIPAddr:DstPort to DIPAddr:DIPPort (NAT state per
// connection) and delivers the frame on the VM port. Only this inbound
// direction is measured: the sink drops what it counts, so the VM never
// answers and the agent's return path (DIP → VIP, DSR) stays idle.
type HostAgent struct {
	// Label names the mode (default "hostagent").
	Label string
	// Bin is the program; Args extra argument templates; Env extra
	// environment.
	Bin  string
	Args []string
	Env  []string
	// Conns is the NAT table's capacity (-conns; 0: the program's
	// default).
	Conns int
}

// Name returns the Label, "hostagent" by default.
func (h HostAgent) Name() string { return orDefault(h.Label, "hostagent") }

// Shape returns PathTunnel and OutputPlain.
func (HostAgent) Shape() (Path, Output) { return PathTunnel, OutputPlain }

// Start writes the document and starts the Host Agent.
func (h HostAgent) Start(ctx context.Context, t *Topology) (Instance, error) {
	args := []string{"-uplink", "{in}", "-host", HostName, "-config", "", "-log-level", "warn"}
	if h.Conns > 0 {
		args = append(args, "-conns", strconv.Itoa(h.Conns))
	}
	return startWithDocument(ctx, t, h, HostAgentDocument(t.SinkLink.MAC, t.DUTOut.Name), Process{Label: h.Name(),
		Path: h.Bin, Args: append(args, h.Args...), Env: h.Env, On: PathTunnel, Delivers: OutputPlain})
}

// startWithDocument writes doc into a temporary directory, puts its path
// after p's "-config", and starts p on t, which must be d's path.
func startWithDocument(ctx context.Context, t *Topology, d PathDUT, doc string, p Process) (Instance, error) {
	if path, _ := d.Shape(); t.Path() != path {
		return nil, fmt.Errorf("pktrate: %s runs on the %v path, the topology is %v", d.Name(), path, t.Path())
	}
	if p.Path == "" {
		return nil, fmt.Errorf("pktrate: %s: no program", d.Name())
	}
	dir, err := os.MkdirTemp("", "pktrate-"+d.Name()+"-")
	if err != nil {
		return nil, err
	}
	file := filepath.Join(dir, d.Name()+".yaml")
	if err := os.WriteFile(file, []byte(doc), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	p.Args = append([]string(nil), p.Args...)
	for i := range p.Args {
		if p.Args[i] == "-config" && i+1 < len(p.Args) {
			p.Args[i+1] = file
		}
	}
	inst, err := p.Start(ctx, t)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &cleanupInstance{Instance: inst, cleanup: func() error { return os.RemoveAll(dir) }}, nil
}

type cleanupInstance struct {
	Instance
	cleanup func() error
}

func (c *cleanupInstance) Stop() error { return errors.Join(c.Instance.Stop(), c.cleanup()) }

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// KernelVXLANDNAT is the DUT mode "kernel-vxlan-dnat": the Linux kernel
// doing the Host Agent's job on PathTunnel, as a host without xdplb would:
//
//   - a vxlan device (VNI TunnelVNI, local DUTInAddr, UDP port 4789, no
//     learning) decapsulates; its MAC is the VM's (the sink's), the inner
//     destination the generator writes, so the kernel takes the inner
//     frame as its own and routes it;
//   - nftables DNATs VIPAddr:DstPort to DIPAddr:DIPPort in prerouting
//     (a nat chain, so with connection tracking: the rule is evaluated
//     for a connection's first packet, the others follow its conntrack
//     entry);
//   - net.ipv4.ip_forward=1 and the connected route and permanent
//     neighbour entry of the DIP deliver it on the VM port.
//
// It needs the nft program (Debian package nftables). All of it runs in
// the DUT ingress veth's NAPI context (the vxlan device's GRO cells are
// scheduled from it and run when it re-enables bottom halves), so the
// DUT's CPU is that NAPI thread's, as for "kernel". Stop removes the
// device and the table and flushes the connection tracking table, so
// every trial starts without state, as a freshly started Host Agent does.
type KernelVXLANDNAT struct{}

// Name returns "kernel-vxlan-dnat".
func (KernelVXLANDNAT) Name() string { return "kernel-vxlan-dnat" }

// Shape returns PathTunnel and OutputPlain.
func (KernelVXLANDNAT) Shape() (Path, Output) { return PathTunnel, OutputPlain }

// NFTTable is the nftables table KernelVXLANDNAT creates in the DUT
// namespace.
const NFTTable = "pktrate"

// nftRules is the table KernelVXLANDNAT loads.
func nftRules() string {
	return fmt.Sprintf(`table ip %s {
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		ip daddr %v udp dport %d dnat to %v:%d
	}
}
`, NFTTable, VIPAddr, DstPort, DIPAddr, DIPPort)
}

// vxlanName is the vxlan device's name in the DUT namespace.
const vxlanName = "pktvx"

// Start creates the vxlan device and the nftables table and turns
// forwarding on.
func (k KernelVXLANDNAT) Start(ctx context.Context, t *Topology) (_ Instance, err error) {
	if t.Path() != PathTunnel {
		return nil, fmt.Errorf("pktrate: %s runs on the tunnel path, the topology is %v", k.Name(), t.Path())
	}
	nft, err := exec.LookPath("nft")
	if err != nil {
		return nil, fmt.Errorf("pktrate: %s needs nft (Debian package nftables): %w", k.Name(), err)
	}
	inst := &kernelVXLAN{t: t, nft: nft}
	defer func() {
		if err != nil {
			_ = inst.Stop()
		}
	}()
	h := t.DUT.Netlink()
	vx := &netlink.Vxlan{
		LinkAttrs: netlink.LinkAttrs{Name: vxlanName, HardwareAddr: t.SinkLink.MAC},
		VxlanId:   TunnelVNI,
		SrcAddr:   DUTInAddr.AsSlice(),
		Port:      VXLANPort,
		Learning:  false,
	}
	if err := h.LinkAdd(vx); err != nil {
		return nil, fmt.Errorf("pktrate: vxlan device in %s: %w", t.DUT, err)
	}
	inst.vx = true
	lk, err := h.LinkByName(vxlanName)
	if err != nil {
		return nil, err
	}
	if err := h.LinkSetUp(lk); err != nil {
		return nil, fmt.Errorf("pktrate: set %s up: %w", vxlanName, err)
	}
	if err := t.DUT.SetSysctl("net.ipv4.conf."+vxlanName+".rp_filter", "0"); err != nil {
		return nil, err
	}
	if err := inst.nftCmd(ctx, nftRules(), "-f", "-"); err != nil {
		return nil, err
	}
	inst.table = true
	if err := t.DUT.SetSysctl("net.ipv4.ip_forward", "1"); err != nil {
		return nil, err
	}
	return inst, nil
}

type kernelVXLAN struct {
	t         *Topology
	nft       string
	vx, table bool
}

// nftCmd runs nft with args in the DUT namespace, stdin on its standard
// input.
func (k *kernelVXLAN) nftCmd(ctx context.Context, stdin string, args ...string) error {
	cmd := k.t.DUT.Command(ctx, k.nft, args...)
	cmd.Stdin = strings.NewReader(stdin)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pktrate: nft %v in %s: %v: %s", args, k.t.DUT, err, out)
	}
	return nil
}

func (k *kernelVXLAN) PIDs() []int { return nil }

func (k *kernelVXLAN) Stop() error {
	t := k.t
	errs := []error{t.DUT.SetSysctl("net.ipv4.ip_forward", "0")}
	if k.table {
		errs = append(errs, k.nftCmd(context.Background(), "", "delete", "table", "ip", NFTTable))
		k.table = false
	}
	if k.vx {
		h := t.DUT.Netlink()
		if lk, err := h.LinkByName(vxlanName); err == nil {
			errs = append(errs, h.LinkDel(lk))
		}
		k.vx = false
	}
	if err := t.DUT.Netlink().ConntrackTableFlush(netlink.ConntrackTable); err != nil {
		errs = append(errs, fmt.Errorf("pktrate: flush the connection tracking table in %s: %w", t.DUT, err))
	}
	return errors.Join(errs...)
}
