// etcdnaming speaks grpc-go's etcd naming (go.etcd.io/etcd/client/v3/naming).
//
//	-mode serve: serve grpc.health.v1 on -listen, then register with
//	             endpoints.Manager.AddEndpoint("<target>/<addr>") under a lease
//	             kept alive; SIGTERM or stdin EOF deletes the endpoint and exits.
//	-mode call:  dial "etcd:///<target>" with the etcd resolver builder and
//	             round_robin; then "call N" commands on stdin (see peer.CallLoop).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/naming/endpoints"
	"go.etcd.io/etcd/client/v3/naming/resolver"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"waypost.interop/internal/peer"
)

func main() {
	etcd := flag.String("etcd", "127.0.0.1:2379", "comma-separated etcd endpoints")
	target := flag.String("target", "", "naming target (keys are <target>/<addr>)")
	mode := flag.String("mode", "call", "serve | call")
	listen := flag.String("listen", "127.0.0.1:0", "serve: listen address")
	name := flag.String("name", "", "serve: backend name (default: bound address)")
	ttl := flag.Int64("ttl", 10, "serve: lease TTL seconds")
	meta := flag.String("meta", "", "serve: endpoint Metadata as a JSON value (default: none, i.e. null)")
	timeout := flag.Duration("timeout", 2*time.Second, "call: per-call timeout")
	flag.Parse()
	if *target == "" {
		peer.Fatalf("-target is required")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: peer.SplitList(*etcd), DialTimeout: 5 * time.Second})
	if err != nil {
		peer.Fatalf("etcd: %v", err)
	}
	defer cli.Close()

	switch *mode {
	case "serve":
		var md any
		if *meta != "" {
			if err := json.Unmarshal([]byte(*meta), &md); err != nil {
				peer.Fatalf("-meta: %v", err)
			}
		}
		serve(cli, *target, *listen, *name, *ttl, md)
	case "call":
		b, err := resolver.NewBuilder(cli)
		if err != nil {
			peer.Fatalf("resolver: %v", err)
		}
		conn, err := grpc.NewClient("etcd:///"+*target,
			grpc.WithResolvers(b),
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`))
		if err != nil {
			peer.Fatalf("dial: %v", err)
		}
		defer conn.Close()
		peer.CallLoop(conn, *timeout, nil, nil)
	default:
		peer.Fatalf("unknown -mode %q", *mode)
	}
}

func serve(cli *clientv3.Client, target, listen, name string, ttl int64, md any) {
	srv, addr := peer.ServeHealth(listen, name)
	defer srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	em, err := endpoints.NewManager(cli, target)
	if err != nil {
		peer.Fatalf("manager: %v", err)
	}
	lease, err := cli.Grant(ctx, ttl)
	if err != nil {
		peer.Fatalf("grant: %v", err)
	}
	key := fmt.Sprintf("%s/%s", target, addr)
	if err := em.AddEndpoint(ctx, key, endpoints.Endpoint{Addr: addr, Metadata: md}, clientv3.WithLease(lease.ID)); err != nil {
		peer.Fatalf("add endpoint: %v", err)
	}
	ka, err := cli.KeepAlive(context.Background(), lease.ID)
	if err != nil {
		peer.Fatalf("keepalive: %v", err)
	}
	go func() {
		for range ka { // drain keepalive responses
		}
	}()
	peer.Emit(map[string]any{"event": "ready", "listen": addr, "key": key})
	peer.WaitForStop()
	dctx, dcancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer dcancel()
	_ = em.DeleteEndpoint(dctx, key)
	_, _ = cli.Revoke(dctx, lease.ID)
}
