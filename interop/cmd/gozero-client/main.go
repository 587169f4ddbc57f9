// gozero-client is a go-zero zrpc client over etcd discovery (Etcd.Hosts +
// Etcd.Key, default balancer p2c_ewma). It reads commands from stdin, one per
// line, and answers each with one JSON line:
//
//	call N       N health checks; {"counts": {"<backend>": n, "error:<Code>": n}}
//	keys N       one call per hash key "key-<i>" (use -balancer consistent_hash):
//	             {"keys": {"key-<i>": "<backend>"}}
//	quit         exit
package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/zeromicro/go-zero/core/conf"
	"github.com/zeromicro/go-zero/core/discov"
	"github.com/zeromicro/go-zero/core/logx"
	"github.com/zeromicro/go-zero/zrpc"

	"waypost.interop/internal/peer"
)

func main() {
	etcd := flag.String("etcd", "127.0.0.1:2379", "comma-separated etcd endpoints")
	key := flag.String("key", "", "discovery key (go-zero Etcd.Key)")
	balancer := flag.String("balancer", "p2c_ewma", "zrpc BalancerName")
	timeout := flag.Duration("timeout", 2*time.Second, "per-call timeout")
	hashKeys := flag.Bool("hash-keys", false, "set a hash key per call (key-<i>) for consistent_hash")
	flag.Parse()
	if *key == "" {
		peer.Fatalf("-key is required")
	}
	logx.Disable()

	var c zrpc.RpcClientConf
	if err := conf.FillDefault(&c); err != nil {
		peer.Fatalf("defaults: %v", err)
	}
	c.Etcd = discov.EtcdConf{Hosts: peer.SplitList(*etcd), Key: *key}
	c.BalancerName = *balancer
	c.Middlewares.Breaker = false // count each backend's answer, not the breaker's
	cli := zrpc.MustNewClient(c)

	var ctxFn func(context.Context, int) context.Context
	if *hashKeys {
		ctxFn = func(ctx context.Context, i int) context.Context {
			return zrpc.SetHashKey(ctx, fmt.Sprintf("key-%d", i))
		}
	}
	peer.CallLoop(cli.Conn(), *timeout, ctxFn, zrpc.SetHashKey)
}
