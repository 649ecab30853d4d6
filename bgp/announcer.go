package bgp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	api "github.com/osrg/gobgp/v3/api"
	"github.com/osrg/gobgp/v3/pkg/server"
)

// Errors returned by the Announcer.
var (
	// ErrClosed is returned by calls made after Shutdown began.
	ErrClosed = errors.New("bgp: announcer is shut down")
	// ErrStarted is returned by a second Start.
	ErrStarted = errors.New("bgp: announcer already started")
	// ErrRestartRequired is returned by Reconfigure when the new Config
	// changes the speaker itself (ASN, router id, listener): the caller must
	// Shutdown this Announcer and start a new one.
	ErrRestartRequired = errors.New("bgp: change needs a new announcer")
	// ErrMultipathTCP is returned by New, Reconfigure and CheckReconfigure
	// for a Config that listens and gives a peer a Password or
	// TTLSecurity in a program whose listeners are multipath TCP (Go's
	// default since 1.24): the kernel refuses TCP-MD5 keys and IP_TTL on
	// those, and incoming sessions would go unprotected.
	ErrMultipathTCP = errors.New(`bgp: a peer has a password or ttl_security, but this program listens with multipath TCP, on which the kernel refuses both: build it with "//go:debug multipathtcp=0" in package main (or run it with GODEBUG=multipathtcp=0)`)
)

// checkListener refuses a Config whose peers' TCP-MD5 or GTSM could not be
// set on this program's listener (see ErrMultipathTCP).
func checkListener(c Config) error {
	if c.ListenPort == 0 {
		return nil
	}
	for _, p := range c.Peers {
		if p.Password != "" || p.TTLSecurity > 0 {
			var lc net.ListenConfig
			if lc.MultipathTCP() {
				return fmt.Errorf("%w (peer %s)", ErrMultipathTCP, p.Address)
			}
			return nil
		}
	}
	return nil
}

type phase uint8

const (
	phaseNew      phase = iota // configured, GoBGP not running
	phaseRunning               // GoBGP running, sessions up or coming up
	phaseStopping              // Shutdown withdrew everything and waits out the grace period
	phaseClosed                // GoBGP stopped, or Shutdown before Start
)

// Announcer announces a set of prefixes (the healthy VIPs of a Mux) to BGP
// peers through an embedded GoBGP server. All methods are safe for
// concurrent use; calls that change the announced set are serialised.
//
// The Announcer keeps two sets: the desired set (what Sync, Announce and
// Withdraw ask for) and the announced set (what GoBGP currently
// originates). They are equal unless the Announcer is draining, not yet
// started, or a GoBGP call failed (the next change retries).
type Announcer struct {
	mu        sync.Mutex
	cfg       Config // defaults applied
	log       *slog.Logger
	srv       *server.BgpServer
	phase     phase
	peers     map[netip.Addr]peerSpec // neighbours configured in GoBGP (or to configure on Start)
	want      map[netip.Prefix]struct{}
	announced map[netip.Prefix]struct{}
	draining  bool
	// cumulative prefix operations, for the metrics
	nAnnounced, nWithdrawn uint64
}

// New checks cfg and returns an Announcer that is not started: nothing
// listens or connects until Start. Prefixes given to Sync or Announce
// before Start are announced by Start.
func New(cfg Config) (*Announcer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := checkListener(cfg); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	a := &Announcer{
		cfg:       cfg,
		log:       cfg.Logger,
		peers:     specsFor(cfg),
		want:      map[netip.Prefix]struct{}{},
		announced: map[netip.Prefix]struct{}{},
	}
	return a, nil
}

func specsFor(c Config) map[netip.Addr]peerSpec {
	m := make(map[netip.Addr]peerSpec, len(c.Peers))
	for _, p := range c.Peers {
		m[p.Address] = specFor(c, p)
	}
	return m
}

// Start runs the GoBGP server: it opens the listener (if Config.ListenPort
// is set), configures every peer (sessions come up in the background; see
// WaitEstablished) and announces the desired prefixes unless draining. ctx
// only bounds the start itself; the server runs until Shutdown. If Start
// fails, it may be called again.
func (a *Announcer) Start(ctx context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch a.phase {
	case phaseRunning, phaseStopping:
		return ErrStarted
	case phaseClosed:
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := checkListen(ctx, a.cfg); err != nil {
		return err
	}
	srv := a.srv
	if srv == nil {
		srv = server.NewBgpServer(server.LoggerOption(newSlogLogger(a.log.With(slog.String("component", "gobgp")))))
		// Serve never returns: GoBGP v3 has no way to end it, so one idle
		// goroutine stays behind after Shutdown. A Start tried again
		// after a failure (StopBgp undid what it began) uses the same
		// server.
		go srv.Serve()
		a.srv = srv
	}

	port := a.cfg.ListenPort
	if port == 0 {
		port = -1 // GoBGP: no listener
	}
	listen := make([]string, len(a.cfg.ListenAddresses))
	for i, l := range a.cfg.ListenAddresses {
		listen[i] = l.String()
	}
	if err := srv.StartBgp(ctx, &api.StartBgpRequest{Global: &api.Global{
		Asn:             a.cfg.ASN,
		RouterId:        a.cfg.RouterID.String(),
		ListenPort:      port,
		ListenAddresses: listen,
	}}); err != nil {
		_ = srv.StopBgp(context.Background(), &api.StopBgpRequest{}) // close any listener already open
		return fmt.Errorf("bgp: start: %w", err)
	}
	for _, addr := range slices.SortedFunc(maps.Keys(a.peers), netip.Addr.Compare) {
		if err := srv.AddPeer(ctx, &api.AddPeerRequest{Peer: a.peers[addr].apiPeer()}); err != nil {
			_ = srv.StopBgp(context.Background(), &api.StopBgpRequest{})
			return fmt.Errorf("bgp: add peer %s: %w", addr, err)
		}
	}
	a.phase = phaseRunning
	a.log.Info("bgp: started", "asn", a.cfg.ASN, "router_id", a.cfg.RouterID,
		"listen_port", a.cfg.ListenPort, "peers", len(a.peers))
	return a.reconcileLocked()
}

// checkListen opens and closes the listeners Start is about to have
// GoBGP open (every address, 0.0.0.0 and ::, when c names none), so that
// one that cannot be opened (its port taken, its address not there, no
// privilege for a port below 1024) fails Start before a GoBGP server
// exists: GoBGP cannot end a server's event loop, and a caller that makes
// a new Announcer for each try would leave one behind each time.
func checkListen(ctx context.Context, c Config) error {
	if c.ListenPort == 0 {
		return nil
	}
	addrs := c.ListenAddresses
	if len(addrs) == 0 {
		addrs = []netip.Addr{netip.IPv4Unspecified(), netip.IPv6Unspecified()}
	}
	for _, addr := range addrs {
		network := "tcp4"
		if addr.Is6() {
			network = "tcp6"
		}
		var lc net.ListenConfig
		lc.SetMultipathTCP(false)
		l, err := lc.Listen(ctx, network, netip.AddrPortFrom(addr, uint16(c.ListenPort)).String())
		if err != nil {
			return fmt.Errorf("bgp: start: %w", err)
		}
		if err := l.Close(); err != nil {
			return fmt.Errorf("bgp: start: %w", err)
		}
	}
	return nil
}

// Reconfigure applies a new Config to a running (or not yet started)
// Announcer: peers are added, removed, or re-created when their settings
// (ASN, port, passive, hold time, connect retry, address families) change,
// which resets that one session; a new next hop re-announces every prefix;
// the new WithdrawGrace applies to the next Shutdown. The Logger is not
// replaced. Changing ASN, RouterID, ListenPort or ListenAddresses returns
// an error wrapping ErrRestartRequired and changes nothing.
func (a *Announcer) Reconfigure(cfg Config) error {
	cfg, err := prepare(cfg)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.checkLocked(cfg); err != nil {
		return err
	}
	cfg.Logger = a.cfg.Logger
	old := a.cfg
	a.cfg = cfg
	want := specsFor(cfg)
	if a.phase == phaseNew {
		a.peers = want
		return nil
	}
	errs := []error{a.reconcilePeersLocked(want)}
	if old.NextHop != cfg.NextHop || old.NextHop6 != cfg.NextHop6 {
		for _, p := range sortedPrefixes(a.announced) {
			if err := a.addPathLocked(p); err != nil {
				errs = append(errs, err)
			}
		}
		a.log.Info("bgp: next hop changed, re-announced", "next_hop", cfg.NextHop, "next_hop6", cfg.NextHop6,
			"prefixes", len(a.announced))
	}
	return errors.Join(errs...)
}

// CheckReconfigure reports whether Reconfigure would take cfg without a
// restart: the error is cfg's Validate error, or wraps ErrRestartRequired
// naming the field that changed, or ErrClosed. It changes nothing, so a
// caller can refuse a whole new configuration before applying any of it.
func (a *Announcer) CheckReconfigure(cfg Config) error {
	cfg, err := prepare(cfg)
	if err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.checkLocked(cfg)
}

// prepare validates a new configuration, checks its listener and fills in
// its defaults.
func prepare(cfg Config) (Config, error) {
	if err := cfg.Validate(); err != nil {
		return cfg, err
	}
	if err := checkListener(cfg); err != nil {
		return cfg, err
	}
	return cfg.withDefaults(), nil
}

// checkLocked reports whether the running speaker can take cfg (defaults
// filled in) without a restart. a.mu is held.
func (a *Announcer) checkLocked(cfg Config) error {
	if a.phase >= phaseStopping {
		return ErrClosed
	}
	if ok, field := a.cfg.sameSpeaker(cfg); !ok {
		return fmt.Errorf("%w: %s changed", ErrRestartRequired, field)
	}
	return nil
}

// SetPeers replaces the peer list, as Reconfigure does with the current
// Config and these peers.
func (a *Announcer) SetPeers(peers []Peer) error {
	a.mu.Lock()
	c := a.cfg
	a.mu.Unlock()
	c.Peers = peers
	return a.Reconfigure(c)
}

// reconcilePeersLocked makes GoBGP's neighbours match want.
func (a *Announcer) reconcilePeersLocked(want map[netip.Addr]peerSpec) error {
	ctx := context.Background()
	var errs []error
	for _, addr := range slices.SortedFunc(maps.Keys(a.peers), netip.Addr.Compare) {
		if spec, ok := want[addr]; ok && spec == a.peers[addr] {
			continue
		}
		if err := a.srv.DeletePeer(ctx, &api.DeletePeerRequest{Address: addr.String()}); err != nil {
			errs = append(errs, fmt.Errorf("bgp: delete peer %s: %w", addr, err))
			continue
		}
		delete(a.peers, addr)
		a.log.Info("bgp: peer removed", "peer", addr)
	}
	for _, addr := range slices.SortedFunc(maps.Keys(want), netip.Addr.Compare) {
		if _, ok := a.peers[addr]; ok {
			continue
		}
		spec := want[addr]
		if err := a.srv.AddPeer(ctx, &api.AddPeerRequest{Peer: spec.apiPeer()}); err != nil {
			errs = append(errs, fmt.Errorf("bgp: add peer %s: %w", addr, err))
			continue
		}
		a.peers[addr] = spec
		a.log.Info("bgp: peer added", "peer", addr, "asn", spec.ASN, "port", spec.Port, "passive", spec.Passive)
	}
	return errors.Join(errs...)
}

// Announce adds prefixes to the desired set and announces them (unless
// draining or not started). Each prefix must be valid and masked (see
// HostPrefix); if one is not, nothing changes.
func (a *Announcer) Announce(prefixes ...netip.Prefix) error {
	return a.update(prefixes, func(want map[netip.Prefix]struct{}) {
		for _, p := range prefixes {
			want[p] = struct{}{}
		}
	})
}

// Withdraw removes prefixes from the desired set and withdraws them.
func (a *Announcer) Withdraw(prefixes ...netip.Prefix) error {
	return a.update(prefixes, func(want map[netip.Prefix]struct{}) {
		for _, p := range prefixes {
			delete(want, p)
		}
	})
}

// Sync makes the desired set exactly want: prefixes not in want are
// withdrawn, new ones announced, the others left alone (no UPDATE is sent
// for them). The Mux calls it after every configuration or health change
// with the host prefixes of its healthy VIPs.
func (a *Announcer) Sync(want []netip.Prefix) error {
	return a.update(want, func(m map[netip.Prefix]struct{}) {
		clear(m)
		for _, p := range want {
			m[p] = struct{}{}
		}
	})
}

// update checks prefixes, applies change to the desired set and
// reconciles. An invalid prefix changes nothing.
func (a *Announcer) update(prefixes []netip.Prefix, change func(map[netip.Prefix]struct{})) error {
	for _, p := range prefixes {
		if err := checkPrefix(p); err != nil {
			return err
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.phase >= phaseStopping {
		return ErrClosed
	}
	change(a.want)
	return a.reconcileLocked()
}

// Drain withdraws every prefix but keeps the sessions up, for a Mux that
// drains or whose data path is down. The desired set is kept and still
// follows Sync; Resume announces it again. Before Start, Drain makes Start
// announce nothing.
func (a *Announcer) Drain() error {
	return a.setDraining(true)
}

// Resume ends Drain: the desired set is announced again.
func (a *Announcer) Resume() error {
	return a.setDraining(false)
}

func (a *Announcer) setDraining(on bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.phase >= phaseStopping {
		return ErrClosed
	}
	if a.draining != on {
		a.draining = on
		a.log.Info("bgp: draining", "on", on, "desired", len(a.want))
	}
	return a.reconcileLocked()
}

// Draining reports whether the Announcer is draining.
func (a *Announcer) Draining() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.draining
}

// Announced returns the prefixes GoBGP currently originates, sorted.
// Whether a peer has received them shows in PeerStates.
func (a *Announcer) Announced() []netip.Prefix {
	a.mu.Lock()
	defer a.mu.Unlock()
	return sortedPrefixes(a.announced)
}

// Shutdown takes the Mux out of the routers' ECMP sets without dropping a
// packet the routers already sent it: it withdraws every prefix (the
// sessions stay up, so the routers reroute at once instead of waiting for a
// hold timer), waits Config.WithdrawGrace while the caller keeps
// forwarding, then stops GoBGP, which closes the sessions (a Cease
// NOTIFICATION to each peer) and the listener.
//
// The grace wait is skipped when nothing was announced (for example after
// Drain). If ctx ends during the wait, Shutdown stops GoBGP at once and
// returns ctx's error. Shutdown before Start only marks the Announcer
// closed; later calls return nil.
func (a *Announcer) Shutdown(ctx context.Context) error {
	a.mu.Lock()
	switch a.phase {
	case phaseNew:
		a.phase = phaseClosed
		a.mu.Unlock()
		return nil
	case phaseStopping, phaseClosed:
		a.mu.Unlock()
		return nil
	}
	n := len(a.announced)
	a.draining = true
	err := a.reconcileLocked()
	a.phase = phaseStopping
	grace, srv := a.cfg.WithdrawGrace, a.srv
	a.mu.Unlock()

	start := time.Now()
	if n > 0 && grace > 0 {
		a.log.Info("bgp: shutdown: prefixes withdrawn, sessions stay up for the grace period", "prefixes", n, "grace", grace)
		t := time.NewTimer(grace)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			err = errors.Join(err, fmt.Errorf("bgp: shutdown: grace period cut short: %w", ctx.Err()))
		}
	}
	stopErr := srv.StopBgp(context.Background(), &api.StopBgpRequest{})
	a.mu.Lock()
	a.phase = phaseClosed
	clear(a.peers)
	a.mu.Unlock()
	a.log.Info("bgp: shutdown: sessions closed", "waited", time.Since(start).Round(time.Millisecond))
	return errors.Join(err, stopErr)
}

// Unstart undoes a Start that has announced nothing: it stops GoBGP (its
// sessions and listeners) and leaves the Announcer configured but not
// started, so that a later Start — after Reconfigure, if need be — runs
// the same GoBGP server. It is for a caller that starts the speaker ahead
// of work that then fails and will be tried again: GoBGP v3 cannot end a
// server, so a new Announcer per try would leave one behind each time.
// Before Start it does nothing; once a prefix was announced it refuses
// (Shutdown withdraws them); after Shutdown it returns ErrClosed.
func (a *Announcer) Unstart(ctx context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch a.phase {
	case phaseNew:
		return nil
	case phaseStopping, phaseClosed:
		return ErrClosed
	}
	if len(a.announced) > 0 {
		return errors.New("bgp: unstart: prefixes are announced (Shutdown withdraws them)")
	}
	err := a.srv.StopBgp(ctx, &api.StopBgpRequest{})
	a.phase = phaseNew
	return err
}

// PeerStates returns a snapshot of every configured session, sorted by
// address; nil before Start and after Shutdown.
func (a *Announcer) PeerStates() []PeerState {
	a.mu.Lock()
	srv, ph := a.srv, a.phase
	a.mu.Unlock()
	if ph != phaseRunning && ph != phaseStopping {
		return nil
	}
	var out []PeerState
	now := time.Now()
	_ = srv.ListPeer(context.Background(), &api.ListPeerRequest{EnableAdvertised: true}, func(p *api.Peer) {
		out = append(out, peerState(p, now))
	})
	slices.SortFunc(out, func(x, y PeerState) int { return x.Address.Compare(y.Address) })
	return out
}

// WaitEstablished waits until the sessions with the given peers (all
// configured peers if none are given) are established, or ctx ends.
func (a *Announcer) WaitEstablished(ctx context.Context, peers ...netip.Addr) error {
	if len(peers) == 0 {
		a.mu.Lock()
		peers = slices.Collect(maps.Keys(a.peers))
		a.mu.Unlock()
	}
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		up := map[netip.Addr]bool{}
		for _, s := range a.PeerStates() {
			up[s.Address] = s.State == StateEstablished
		}
		var down []netip.Addr
		for _, p := range peers {
			if !up[p] {
				down = append(down, p)
			}
		}
		if len(down) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			slices.SortFunc(down, netip.Addr.Compare)
			return fmt.Errorf("bgp: sessions not established with %v: %w", down, ctx.Err())
		case <-t.C:
		}
	}
}

// reconcileLocked makes the announced set equal to the desired set (empty
// when draining). Only a running Announcer talks to GoBGP. Failed
// operations are reported and retried by the next call.
func (a *Announcer) reconcileLocked() error {
	if a.phase != phaseRunning {
		return nil
	}
	target := a.want
	if a.draining {
		target = nil
	}
	var errs []error
	var gone, added []netip.Prefix
	if len(target) == 0 && len(a.announced) > 1 {
		// Everything goes: one request, and GoBGP packs the withdrawals
		// into as few UPDATEs as fit.
		if err := a.srv.DeletePath(context.Background(), &api.DeletePathRequest{TableType: api.TableType_GLOBAL}); err != nil {
			errs = append(errs, fmt.Errorf("bgp: withdraw all: %w", err))
		} else {
			gone = sortedPrefixes(a.announced)
			clear(a.announced)
		}
	}
	for _, p := range sortedPrefixes(a.announced) {
		if _, ok := target[p]; ok {
			continue
		}
		if err := a.deletePathLocked(p); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(a.announced, p)
		gone = append(gone, p)
	}
	for _, p := range sortedPrefixes(target) {
		if _, ok := a.announced[p]; ok {
			continue
		}
		if err := a.addPathLocked(p); err != nil {
			errs = append(errs, err)
			continue
		}
		a.announced[p] = struct{}{}
		added = append(added, p)
		if !a.carriedLocked(p) {
			a.log.Warn("bgp: no peer session carries this prefix's address family; "+
				"set next_hop6 (or next_hop) or add a peer of that family", "prefix", p)
		}
	}
	a.nWithdrawn += uint64(len(gone))
	a.nAnnounced += uint64(len(added))
	if len(gone) > 0 {
		a.log.Info("bgp: withdrawn", "prefixes", gone)
	}
	if len(added) > 0 {
		a.log.Info("bgp: announced", "prefixes", added)
	}
	return errors.Join(errs...)
}

func (a *Announcer) carriedLocked(p netip.Prefix) bool {
	for _, s := range a.peers {
		if s.carries(p) {
			return true
		}
	}
	return false
}

func (a *Announcer) nextHop(p netip.Prefix) netip.Addr {
	if p.Addr().Is4() {
		return a.cfg.NextHop
	}
	return a.cfg.NextHop6
}

func (a *Announcer) addPathLocked(p netip.Prefix) error {
	path, err := apiPath(p, a.nextHop(p))
	if err == nil {
		_, err = a.srv.AddPath(context.Background(), &api.AddPathRequest{TableType: api.TableType_GLOBAL, Path: path})
	}
	if err != nil {
		return fmt.Errorf("bgp: announce %v: %w", p, err)
	}
	return nil
}

func (a *Announcer) deletePathLocked(p netip.Prefix) error {
	path, err := apiPath(p, a.nextHop(p))
	if err == nil {
		err = a.srv.DeletePath(context.Background(), &api.DeletePathRequest{TableType: api.TableType_GLOBAL, Path: path})
	}
	if err != nil {
		return fmt.Errorf("bgp: withdraw %v: %w", p, err)
	}
	return nil
}

func comparePrefix(x, y netip.Prefix) int {
	if c := x.Addr().Compare(y.Addr()); c != 0 {
		return c
	}
	return cmp.Compare(x.Bits(), y.Bits())
}

func sortedPrefixes(m map[netip.Prefix]struct{}) []netip.Prefix {
	return slices.SortedFunc(maps.Keys(m), comparePrefix)
}
