package bgp

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// The BIRD tests run each Mux's Announcer in its own process inside the
// Mux's network namespace: GoBGP dials and listens from goroutines it
// starts, and goroutines do not inherit a locked thread's namespace, so a
// whole process (started with `ip netns exec`) is the only reliable way to
// put GoBGP's sockets in a namespace. That process is this test binary,
// re-executed with helperEnv set; TestMain then runs helperMain instead of
// the tests.

const (
	helperEnv       = "XDPLB_BGP_HELPER"        // "1": run as a Mux helper process
	helperConfigEnv = "XDPLB_BGP_HELPER_CONFIG" // the helper's Config as JSON (Logger nil)
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		os.Exit(helperMain())
	}
	os.Exit(m.Run())
}

// helperMain drives one Announcer from line commands on stdin and answers
// each on stdout with "ok [detail]" or "err message":
//
//	start                  Start
//	wait                   WaitEstablished (all peers)
//	sync [prefix...]       Sync; detail = wall-clock ns just before the call
//	drain | resume         Drain | Resume; detail as for sync
//	shutdown               Shutdown in the background; detail as for sync;
//	                       "shutdown-done [error]" follows when it returns
//	cancel                 cancel the context given to Shutdown
//	states                 PeerStates as JSON
//
// End of input shuts down at once and exits. Logs go to stderr.
func helperMain() int {
	level := slog.LevelInfo
	if os.Getenv("XDPLB_BGP_DEBUG") != "" {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	var cfg Config
	if err := json.Unmarshal([]byte(os.Getenv(helperConfigEnv)), &cfg); err != nil {
		log.Error("helper: config", "err", err)
		return 2
	}
	cfg.Logger = log
	a, err := New(cfg)
	if err != nil {
		log.Error("helper: new", "err", err)
		return 2
	}

	var outMu sync.Mutex
	reply := func(format string, args ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", args...)
	}
	result := func(err error, detail ...any) {
		if err != nil {
			reply("err %s", strings.ReplaceAll(err.Error(), "\n", "; "))
			return
		}
		reply("ok%s", strings.TrimRight(" "+fmt.Sprint(detail...), " "))
	}
	shCtx, shCancel := context.WithCancel(context.Background())
	defer shCancel()
	shDone := make(chan struct{})
	shStarted := false

	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		now := time.Now().UnixNano()
		switch f[0] {
		case "start":
			result(a.Start(context.Background()))
		case "wait":
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			result(a.WaitEstablished(ctx))
			cancel()
		case "sync":
			var ps []netip.Prefix
			for _, s := range f[1:] {
				p, err := netip.ParsePrefix(s)
				if err != nil {
					result(err)
					continue
				}
				ps = append(ps, p)
			}
			result(a.Sync(ps), now)
		case "drain":
			result(a.Drain(), now)
		case "resume":
			result(a.Resume(), now)
		case "shutdown":
			shStarted = true
			go func() {
				err := a.Shutdown(shCtx)
				reply("shutdown-done %v", err)
				close(shDone)
			}()
			result(nil, now)
		case "cancel":
			// Answer first: once the context is cancelled, Shutdown's
			// "shutdown-done" may be written at once, and the test, which
			// reads the answer to "cancel" first, would skip past it.
			result(nil, time.Now().UnixNano())
			shCancel()
		case "states":
			b, err := json.Marshal(a.PeerStates())
			result(err, string(b))
		default:
			result(fmt.Errorf("unknown command %q", f[0]))
		}
	}
	shCancel()
	if shStarted {
		<-shDone
	} else if err := a.Shutdown(shCtx); err != nil {
		log.Info("helper: shutdown", "err", err)
	}
	return 0
}
