package fleetlab

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// BIRD is a BIRD 2 daemon running as a lab's router.
type BIRD struct {
	// Proc is the daemon (bird -f); stop it with Proc.Stop.
	Proc *Proc
	// Socket is its control socket, for birdc -s.
	Socket string
}

// StartBIRD writes cfg to dir/bird.conf, checks it (bird -p), and starts
// BIRD in the foreground in n with its control socket at dir/bird.ctl.
// proc gives the process's settings but for Name, Path and Args, which
// StartBIRD sets ("bird", its log goes to proc.Output). Call WaitReady
// before using birdc.
func StartBIRD(n *netlab.NS, dir string, cfg BIRDConfig, proc ProcConfig) (*BIRD, error) {
	conf := filepath.Join(dir, "bird.conf")
	if err := os.WriteFile(conf, []byte(cfg.Text()), 0o644); err != nil {
		return nil, err
	}
	if out, err := exec.Command("bird", "-p", "-c", conf).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("bird -p (parse only): %w: %s", err, out)
	}
	b := &BIRD{Socket: filepath.Join(dir, "bird.ctl")}
	var err error
	proc.Name, proc.Path, proc.Args = "bird", "bird", []string{"-f", "-c", conf, "-s", b.Socket}
	b.Proc, err = StartProc(n, proc)
	if err != nil {
		return nil, err
	}
	return b, nil
}

// WaitReady waits (up to limit) until BIRD answers on its control socket.
func (b *BIRD) WaitReady(ctx context.Context, limit time.Duration) error {
	return Poll(ctx, "BIRD's control socket", limit, func() bool {
		_, err := b.Birdc("show status")
		return err == nil
	})
}

// Birdc runs a birdc command (its words separated by blanks) and returns
// the output.
func (b *BIRD) Birdc(command string) (string, error) {
	out, err := exec.Command("birdc", append([]string{"-s", b.Socket}, strings.Fields(command)...)...).CombinedOutput()
	return string(out), err
}

// ProtocolState returns the state BIRD shows for a protocol: for BGP
// "Established", "Active", "Connect" and so on; "" when birdc does not
// list it.
func (b *BIRD) ProtocolState(name string) (string, error) {
	out, err := b.Birdc("show protocols " + name)
	if err != nil {
		return "", fmt.Errorf("birdc show protocols %s: %w: %s", name, err, out)
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 6 && f[0] == name {
			return f[len(f)-1], nil
		}
	}
	return "", nil
}
