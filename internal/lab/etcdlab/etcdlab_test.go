package etcdlab

import (
	"context"
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
