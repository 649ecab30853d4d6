package fleetlab

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/xdplb/xdplb/internal/lab/netlab"
)

// ProcConfig describes a process to run in a namespace.
type ProcConfig struct {
	// Name names the process in errors and logs.
	Name string
	// Path and Args are the program and its arguments.
	Path string
	Args []string
	// Env is added to this program's environment (os.Environ), which the
	// process inherits.
	Env []string
	// Stdin is the process's standard input; nil for none.
	Stdin io.Reader
	// Stdout receives the standard output; nil sends it to Output.
	Stdout io.Writer
	// Output receives the standard error, and the standard output unless
	// Stdout is set; nil captures it in memory, for Proc.Output.
	Output io.Writer
	// OwnProcessGroup puts the process in a process group of its own, so
	// that a terminal's Ctrl-C reaches only the program that started it
	// (which then stops its processes in order).
	OwnProcessGroup bool
}

// Proc is a process running in a lab namespace (started through
// netlab.NS.Command, so the lab kills it on Close if nothing stopped it
// before).
type Proc struct {
	name string
	cmd  *exec.Cmd
	out  *LockedBuffer // nil unless the output is captured
	done chan struct{}
	err  error // Wait's result, once done is closed
}

// StartProc starts cfg in n.
func StartProc(n *netlab.NS, cfg ProcConfig) (*Proc, error) {
	p := &Proc{name: cfg.Name, done: make(chan struct{})}
	out := cfg.Output
	if out == nil {
		p.out = new(LockedBuffer)
		out = p.out
	}
	p.cmd = n.Command(context.Background(), cfg.Path, cfg.Args...)
	if cfg.Env != nil {
		p.cmd.Env = append(os.Environ(), cfg.Env...)
	}
	p.cmd.Stdin = cfg.Stdin
	p.cmd.Stdout, p.cmd.Stderr = out, out
	if cfg.Stdout != nil {
		p.cmd.Stdout = cfg.Stdout
	}
	if cfg.OwnProcessGroup {
		p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", cfg.Name, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	return p, nil
}

// Name returns the process's name (ProcConfig.Name).
func (p *Proc) Name() string { return p.name }

// Output returns what the process wrote so far, when ProcConfig.Output
// was nil; "" otherwise.
func (p *Proc) Output() string {
	if p.out == nil {
		return ""
	}
	return p.out.String()
}

// PID returns the process's id (ip netns exec runs the program in its
// own process).
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err returns the process's exit error (exec.Cmd.Wait's) once it has
// exited, nil before.
func (p *Proc) Err() error {
	if !p.Exited() {
		return nil
	}
	return p.err
}

// Terminate sends SIGTERM and returns without waiting.
func (p *Proc) Terminate() error { return p.cmd.Process.Signal(syscall.SIGTERM) }

// Kill kills the process (SIGKILL: no chance to clean up, as when a node
// dies) and waits for it to exit.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Wait waits for the process to exit, kills it when it has not after
// grace, and returns its exit error.
func (p *Proc) Wait(grace time.Duration) error {
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	return p.err
}

// Stop sends SIGTERM, unless the process has exited already, and Waits
// for it; it returns the exit error.
func (p *Proc) Stop(grace time.Duration) error {
	if p.Exited() {
		return p.err
	}
	_ = p.Terminate()
	return p.Wait(grace)
}
