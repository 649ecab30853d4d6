// Package health probes DIPs (backends) and decides, per target, whether it
// may take new flows: the Mux keeps a DIP in a VIP's Maglev table only
// while its state is Up.
//
// # Probes
//
// A Spec says how one VIP's DIPs are probed: TCP connect (success = the
// handshake completes within Timeout; the connection is then reset) or
// HTTP (Method Path with "Connection: close", success = ExpectStatus,
// Timeout covering connect, request, response and body, redirects not
// followed), every Interval, with Rise and Fall thresholds. It is the
// probe: section of a VIP in the desired-state document; WithDefaults fills
// what the document leaves out and Validate checks the rest.
//
// NetProber runs probes over real sockets. Probes are sent from an
// infrastructure address when CheckerConfig.Source (NetProber.Source) is
// set, since hosts never NAT those sources; a DialContext hook replaces
// the dialer entirely, for example to probe from inside a network
// namespace (netlab's NS.Dial has the right signature). Any Prober can
// stand in, e.g. a scripted one in a test.
//
// # States
//
// A target starts Unknown, which the data path treats as not healthy. Its
// first probe decides it: Up on success, Down on failure. (A new backend
// thus takes no traffic before one probe has passed, and a Mux that starts
// with every backend Unknown has its backends decided within one Interval
// plus Timeout, not Rise intervals.) From Up, Fall consecutive failures
// make it Down; from Down, Rise consecutive successes make it Up.
//
// # Detection time
//
// Probes of a target run back to back and never overlap: the next starts
// Interval after the previous one ended, the wait jittered uniformly by
// ±IntervalJitter (10%), and a target's first probe is placed uniformly
// within its first Interval, so that thousands of targets do not probe in
// step. A Timeout longer than the Interval is therefore allowed, as health
// checkers commonly allow: such a probe just outlasts the wait between two.
// The design's nominal time to mark a DIP down is Timeout×Fall +
// Interval×(Fall−1), from the start of the first failed probe (interval
// 2s, timeout 5s, fall 3: 19s). What a Checker guarantees, counted from
// the moment the DIP stops answering and including the probe that may be
// in flight then, the jitter and a per-probe scheduling allowance
// (ProbeSlack), is Spec.DownBound; Spec.UpBound is the same for recovery.
// Tests check both in exact fake time.
//
// # Checker
//
// A Checker probes a set of Targets (key, address, Spec) with one
// goroutine per target while Run runs. Set replaces the set by
// reconciliation: unchanged targets keep their state and schedule, so a
// configuration reload resets no health. State changes are logged with
// log/slog and delivered in order to CheckerConfig.OnChange from a single
// goroutine (or to OnChanges, in batches of whatever queued up while the
// previous batch was handled: a Mux applies each batch as one snapshot); Snapshot returns every target's state, last result and probe
// counters, which the Mux exports as metrics. Every probe's context
// carries its target's key (TargetKey), so a Prober can tell apart targets
// with the same address, e.g. two tenants' DIPs behind two interfaces of
// one host.
//
// # Verdicts
//
// A Verdict is one DIP's health as a host that probed it reports it:
// (VNI, address, probed port), up or not, since when, why. A Host Agent
// probes the DIPs on its own host and reports Verdicts; a Mux whose health
// comes from outside (mux.Config.ExternalHealth) applies them instead of
// probing.
package health
