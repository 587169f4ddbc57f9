// gozero-server is a go-zero zrpc server registered in etcd by zrpc itself
// (key "<key>/<lease id>", or "<key>/<id>" with -id). It serves
// grpc.health.v1 and names itself in the "x-backend" trailer of every call.
// It prints {"event":"ready",...} once the port is open (zrpc has registered
// in etcd by then: go-zero registers before it listens). SIGTERM or stdin EOF
// stop it through go-zero's shutdown (revoke, then GracefulStop).
package main

import (
	"flag"
	"io"
	"os"
	"syscall"
	"time"

	"github.com/zeromicro/go-zero/core/conf"
	"github.com/zeromicro/go-zero/core/discov"
	"github.com/zeromicro/go-zero/core/logx"
	"github.com/zeromicro/go-zero/core/service"
	"github.com/zeromicro/go-zero/zrpc"
	"google.golang.org/grpc"

	"waypost.interop/internal/peer"
)

func main() {
	etcd := flag.String("etcd", "127.0.0.1:2379", "comma-separated etcd endpoints")
	key := flag.String("key", "", "registration key (go-zero Etcd.Key)")
	listen := flag.String("listen", "127.0.0.1:0", "listen address (host:port, port required)")
	id := flag.Int64("id", 0, "custom registration ID (0: the lease id)")
	name := flag.String("name", "", "backend name for the x-backend trailer (default: -listen)")
	flag.Parse()
	if *key == "" {
		peer.Fatalf("-key is required")
	}
	if *name == "" {
		*name = *listen
	}

	var c zrpc.RpcServerConf
	if err := conf.FillDefault(&c); err != nil {
		peer.Fatalf("defaults: %v", err)
	}
	c.Name = "interop"
	c.Mode = service.DevMode // no load shedding in tests
	c.Log.Mode = "console"
	c.Log.Level = "error"
	c.Log.Stat = false
	c.ListenOn = *listen
	c.Etcd = discov.EtcdConf{Hosts: peer.SplitList(*etcd), Key: *key, ID: *id}
	c.Health = false // our own health service names the backend
	c.Middlewares.Stat = false
	c.CpuThreshold = 0
	// SIGTERM: revoke at once (wrap-up), GracefulStop soon after, force-quit bound short for tests
	c.Shutdown.WrapUpTime = 300 * time.Millisecond
	c.Shutdown.WaitTime = 3 * time.Second

	srv := zrpc.MustNewServer(c, func(s *grpc.Server) {
		peer.RegisterHealth(s)
		// Called by zrpc after net.Listen: the port is open from here on.
		peer.Emit(map[string]any{"event": "ready", "listen": *listen, "name": *name})
	})
	srv.AddUnaryInterceptors(peer.NameInterceptor(*name))
	// stdin EOF (the test process went away) is a SIGTERM: go-zero's own graceful path
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		_ = syscall.Kill(os.Getpid(), syscall.SIGTERM)
	}()
	logx.DisableStat()
	defer srv.Stop()
	srv.Start()
}
