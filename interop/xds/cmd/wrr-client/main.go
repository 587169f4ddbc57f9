// wrr-client dials a fixed list of backends with a service config (e.g.
// weighted_round_robin, gRFC A58) and calls /waypost.test.Echo/Unary in a
// bounded loop, printing JSON lines (see echo.RunCalls).
//
// -target ipv4:127.0.0.1:A,127.0.0.1:B (grpc-go has no ipv4: resolver, so the
// list goes through a manual resolver); any other target is dialed as is.
// weighted_round_robin reads ORCA from per-call trailers, or out of band when
// the config says enableOobLoadReport.
package main

import (
	"flag"
	"strings"

	"google.golang.org/grpc"
	_ "google.golang.org/grpc/balancer/weightedroundrobin" // registers weighted_round_robin
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	"waypost.interop/xds/internal/echo"
)

func main() {
	target := flag.String("target", "", "ipv4:HOST:PORT,HOST:PORT (or any grpc-go target)")
	config := flag.String("config", `{"loadBalancingConfig":[{"round_robin":{}}]}`, "service config JSON")
	cf := echo.RegisterClientFlags()
	flag.Parse()
	if *target == "" {
		echo.Fatalf("-target is required")
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(*config),
	}
	dial := *target
	if list, ok := strings.CutPrefix(*target, "ipv4:"); ok {
		r := manual.NewBuilderWithScheme("waypost-list")
		var eps []resolver.Endpoint
		for _, a := range strings.Split(list, ",") {
			if a = strings.TrimSpace(a); a != "" {
				eps = append(eps, resolver.Endpoint{Addresses: []resolver.Address{{Addr: a}}})
			}
		}
		if len(eps) == 0 {
			echo.Fatalf("no address in %q", *target)
		}
		r.InitialState(resolver.State{Endpoints: eps})
		opts = append(opts, grpc.WithResolvers(r))
		dial = "waypost-list:///backends"
	}
	conn, err := grpc.NewClient(dial, opts...)
	if err != nil {
		echo.Fatalf("dial %s: %v", *target, err)
	}
	defer conn.Close()
	echo.RunCalls(conn, cf)
}
