// Package etcdlab runs etcd members embedded in a process
// (go.etcd.io/etcd/server/v3/embed) for tests, the lab and benchmarks.
// Members listen on Unix sockets, for clients and for each other: a path
// in the file system reaches a member from every network namespace, and
// no test traffic leaves the machine or touches an address outside the
// lab's.
//
// etcd's peer transport dials a Unix socket by the host:port of the
// peer's URL, never by a path, so the members of a cluster of several
// name their peer sockets relative to the working directory
// (unix://etcd1:2380 is the file "etcd1:2380"): every member of such a
// cluster runs in a process of its own whose working directory is the
// cluster's directory (Cluster.Dir). A one-member cluster has no peers
// to reach and runs anywhere.
package etcdlab

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc/grpclog"
)

func init() {
	// etcd's gRPC logs go to stderr at info level by default; tests and
	// the lab want their own output readable.
	grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, io.Discard, os.Stderr))
}

// Member is one member of a cluster.
type Member struct {
	Name string
	// Dir holds the member's data and its sockets.
	Dir string
}

// ClientURL is the member's client endpoint (a Unix socket).
func (m Member) ClientURL() string { return "unix://" + filepath.Join(m.Dir, "client.sock") }

// Cluster names the members of a cluster.
type Cluster []Member

// Dir is the directory the members' directories are in (NewCluster's
// dir): the working directory of every member of a cluster of several.
func (c Cluster) Dir() string { return filepath.Dir(c[0].Dir) }

// peerURL is member i's peer endpoint: a socket in its directory when it
// is alone, else one named relative to c.Dir (see the package
// documentation).
func (c Cluster) peerURL(i int) url.URL {
	if len(c) == 1 {
		return url.URL{Scheme: "unix", Path: filepath.Join(c[i].Dir, "peer.sock")}
	}
	return url.URL{Scheme: "unix", Host: c[i].Name + ":2380"}
}

// NewCluster lays out n members under dir (which must exist).
func NewCluster(dir string, n int) Cluster {
	c := make(Cluster, n)
	for i := range c {
		c[i] = Member{Name: fmt.Sprintf("etcd%d", i+1), Dir: filepath.Join(dir, fmt.Sprintf("etcd%d", i+1))}
	}
	return c
}

// Endpoints are every member's client URL.
func (c Cluster) Endpoints() []string {
	eps := make([]string, len(c))
	for i, m := range c {
		eps[i] = m.ClientURL()
	}
	return eps
}

// Start starts member i of c in this process and waits until it serves
// (for a cluster of several members: until enough members run to elect a
// leader, so start them concurrently, each in a process of its own
// working in c.Dir — Start refuses to start one elsewhere). A member
// with data from an earlier start rejoins the cluster with it. Close the
// returned server to stop the member.
func (c Cluster) Start(i int, timeout time.Duration) (*embed.Etcd, error) {
	m := c[i]
	if len(c) > 1 {
		wd, err := os.Getwd()
		if err != nil {
			return nil, err
		}
		if !sameFile(wd, c.Dir()) {
			return nil, fmt.Errorf("etcdlab: %s of a cluster of %d runs in %s, not in the cluster's directory %s: the peers' sockets are named relative to it",
				m.Name, len(c), wd, c.Dir())
		}
	}
	if err := os.MkdirAll(m.Dir, 0o700); err != nil {
		return nil, err
	}
	cfg := embed.NewConfig()
	cfg.Name = m.Name
	cfg.Dir = filepath.Join(m.Dir, "data")
	cu, _ := url.Parse(m.ClientURL())
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	pu := c.peerURL(i)
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	var ic []string
	for j, o := range c {
		u := c.peerURL(j)
		ic = append(ic, o.Name+"="+u.String())
	}
	cfg.InitialCluster = strings.Join(ic, ",")
	cfg.InitialClusterToken = "xdplb-lab"
	if _, err := os.Stat(cfg.Dir); err == nil {
		cfg.ClusterState = embed.ClusterStateFlagExisting
	}
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	// Sockets left by a member that was killed (etcd replaces a stale
	// peer socket itself).
	os.Remove(filepath.Join(m.Dir, "client.sock"))
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("etcdlab: start %s: %w", m.Name, err)
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("etcdlab: %s: %w", m.Name, err)
	case <-time.After(timeout):
		e.Server.Stop()
		e.Close()
		return nil, fmt.Errorf("etcdlab: %s not ready within %v", m.Name, timeout)
	}
}

// Client returns a client of the given endpoints.
func Client(endpoints []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second,
		Logger: zap.NewNop(), DialKeepAliveTime: 2 * time.Second, DialKeepAliveTimeout: 2 * time.Second})
}

// Wait waits until the cluster answers a linearizable read.
func Wait(ctx context.Context, c *clientv3.Client) error {
	for {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := c.Get(rctx, "health")
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("etcdlab: cluster not answering: %w", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// sameFile reports whether paths a and b name the same directory.
func sameFile(a, b string) bool {
	sa, err1 := os.Stat(a)
	sb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(sa, sb)
}
