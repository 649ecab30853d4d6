package etcdlab

import (
	"context"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestOneMember(t *testing.T) {
	c := NewCluster(t.TempDir(), 1)
	e, err := c.Start(0, 20*time.Second)
	require.NoError(t, err)
	defer e.Close()
	cli, err := Client(c.Endpoints())
	require.NoError(t, err)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, Wait(ctx, cli))
	_, err = cli.Put(ctx, "k", "v")
	require.NoError(t, err)
	r, err := cli.Get(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, "v", string(r.Kvs[0].Value))
}

// TestThreeMembers runs a cluster of three members, each a process of its
// own (this test binary, TestMemberProcess), and checks it serves with
// one member killed, and that the killed member rejoins with its data.
func TestThreeMembers(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	c := NewCluster(t.TempDir(), 3)
	procs := make([]*exec.Cmd, len(c))
	start := func(i int) {
		cmd := exec.Command(exe, "-test.run=^TestMemberProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), c.MemberEnv(i))
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		require.NoError(t, cmd.Start())
		t.Cleanup(func() {
			cmd.Process.Signal(syscall.SIGTERM)
			cmd.Wait()
			if t.Failed() {
				t.Logf("%s:\n%s", c[i].Name, out.String())
			}
		})
		procs[i] = cmd
	}
	for i := range c {
		start(i)
	}
	cli, err := Client(c.Endpoints())
	require.NoError(t, err)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, Wait(ctx, cli))
	_, err = cli.Put(ctx, "k", "1")
	require.NoError(t, err)

	require.NoError(t, procs[0].Process.Kill())
	procs[0].Wait()
	// A write fails while the two elect a new leader (when the killed
	// member led): the client does not retry writes.
	for {
		if _, err = cli.Put(ctx, "k", "2"); err == nil || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	require.NoError(t, err, "two members of three serve")

	start(0)
	r, err := cli.Get(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, "2", string(r.Kvs[0].Value))
	// The restarted member serves, with what it missed.
	one, err := Client(c.Endpoints()[:1])
	require.NoError(t, err)
	defer one.Close()
	require.NoError(t, Wait(ctx, one))
	r, err = one.Get(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, "2", string(r.Kvs[0].Value))
}

// TestMemberProcess is no test: it is a member's process for
// TestThreeMembers, which runs this test binary with MemberEnv set.
func TestMemberProcess(t *testing.T) {
	if os.Getenv(MemberEnv) == "" {
		t.Skip("not a test: a member process of TestThreeMembers")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	require.NoError(t, RunMember(ctx, time.Minute, nil))
}

// TestSeveralMembersNeedTheirDirectory: a member of a cluster of several
// refuses to start outside the cluster's directory, where its peers
// could not reach it.
func TestSeveralMembersNeedTheirDirectory(t *testing.T) {
	c := NewCluster(t.TempDir(), 3)
	_, err := c.Start(0, time.Second)
	require.ErrorContains(t, err, "not in the cluster's directory")
}
