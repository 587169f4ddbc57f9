// gcp-server: Envoy's go-control-plane (SnapshotCache, one snapshot shared by every node) serving the same
// resources waypost's control plane serves for an export: per service NAME a Listener (api_listener, RDS over
// ADS), a RouteConfiguration, an EDS Cluster and a ClusterLoadAssignment with -endpoints endpoints.
//
// It is the rival in bench/xds_scale.py. Each type carries its own version, so a change of endpoints bumps
// only the EDS version (the cache then answers only EDS watches, the cheapest use of it).
//
// stdin commands (one per line), each answered by one JSON line on stdout:
//
//	change SVC   add an endpoint to service SVC (0-based), or remove the one added last time -> {"changed": V}
//	quit         exit
//
// It prints {"listening": "HOST:PORT"} once it serves.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// fleet: every node shares one snapshot
type fleet struct{}

func (fleet) ID(*core.Node) string { return "fleet" }

var ads = &core.ConfigSource{
	ResourceApiVersion:    core.ApiVersion_V3,
	ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}},
}

func serviceName(i int) string { return fmt.Sprintf("svc-%d", i) }

func listenerOf(name string) types.Resource {
	r, _ := anypb.New(&router.Router{})
	manager := &hcm.HttpConnectionManager{
		RouteSpecifier: &hcm.HttpConnectionManager_Rds{Rds: &hcm.Rds{ConfigSource: ads, RouteConfigName: name}},
		HttpFilters:    []*hcm.HttpFilter{{Name: "envoy.filters.http.router", ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: r}}},
	}
	m, _ := anypb.New(manager)
	return &listener.Listener{Name: name, ApiListener: &listener.ApiListener{ApiListener: m}}
}

func routeOf(name string) types.Resource {
	return &route.RouteConfiguration{Name: name, VirtualHosts: []*route.VirtualHost{{
		Name: name, Domains: []string{"*"},
		Routes: []*route.Route{{
			Match:  &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: ""}},
			Action: &route.Route_Route{Route: &route.RouteAction{ClusterSpecifier: &route.RouteAction_Cluster{Cluster: name}}},
		}},
	}}}
}

func clusterOf(name string) types.Resource {
	return &cluster.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_EDS},
		EdsClusterConfig:     &cluster.Cluster_EdsClusterConfig{EdsConfig: ads},
		LbPolicy:             cluster.Cluster_ROUND_ROBIN,
	}
}

func assignmentOf(name string, svc, n int) types.Resource {
	eps := make([]*endpoint.LbEndpoint, 0, n)
	for j := 0; j < n; j++ {
		addr := fmt.Sprintf("10.%d.%d.%d", svc%250, j/250, j%250+1)
		eps = append(eps, &endpoint.LbEndpoint{
			HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{Address: &core.Address{
				Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
					Address: addr, PortSpecifier: &core.SocketAddress_PortValue{PortValue: 8080}}}}}},
			HealthStatus:        core.HealthStatus_HEALTHY,
			LoadBalancingWeight: wrapperspb.UInt32(100),
		})
	}
	return &endpoint.ClusterLoadAssignment{ClusterName: name, Endpoints: []*endpoint.LocalityLbEndpoints{{
		Locality: &core.Locality{}, LbEndpoints: eps, LoadBalancingWeight: wrapperspb.UInt32(uint32(max(n, 1)) * 100),
	}}}
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "where to serve ADS")
	services := flag.Int("services", 1, "services (svc-0 ... svc-N-1)")
	endpoints := flag.Int("endpoints", 10, "endpoints per service")
	flag.Parse()
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil {
		lim.Cur = lim.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}

	counts := make([]int, *services)
	var static [3][]types.Resource
	for i := range counts {
		counts[i] = *endpoints
		static[0] = append(static[0], listenerOf(serviceName(i)))
		static[1] = append(static[1], routeOf(serviceName(i)))
		static[2] = append(static[2], clusterOf(serviceName(i)))
	}
	assignments := make([]types.Resource, *services)
	for i := range assignments {
		assignments[i] = assignmentOf(serviceName(i), i, counts[i])
	}
	version := 1
	snapshot := func() *cachev3.Snapshot {
		s := &cachev3.Snapshot{}
		s.Resources[types.Listener] = cachev3.NewResources("1", static[0])
		s.Resources[types.Route] = cachev3.NewResources("1", static[1])
		s.Resources[types.Cluster] = cachev3.NewResources("1", static[2])
		s.Resources[types.Endpoint] = cachev3.NewResources(strconv.Itoa(version), assignments)
		return s
	}
	ctx := context.Background()
	// ads=true (ordered responses) only for one service: with it, v0.14 does not answer a request naming part
	// of the snapshot (its superset check), which is what a client of one of several services sends
	cache := cachev3.NewSnapshotCache(*services == 1, fleet{}, nil)
	if err := cache.SetSnapshot(ctx, "fleet", snapshot()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	srv := serverv3.NewServer(ctx, cache, nil)
	g := grpc.NewServer(grpc.MaxConcurrentStreams(1000000))
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(g, srv)
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	go func() { _ = g.Serve(lis) }()
	out := json.NewEncoder(os.Stdout)
	_ = out.Encode(map[string]any{"listening": lis.Addr().String()})

	added := make([]bool, *services)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		fields := strings.Fields(in.Text())
		if len(fields) == 0 {
			continue
		}
		switch fields[0] {
		case "change":
			svc := 0
			if len(fields) > 1 {
				svc, _ = strconv.Atoi(fields[1])
			}
			if svc < 0 || svc >= *services {
				_ = out.Encode(map[string]any{"error": "no such service"})
				continue
			}
			added[svc] = !added[svc]
			n := counts[svc]
			if added[svc] {
				n++
			}
			assignments[svc] = assignmentOf(serviceName(svc), svc, n)
			version++
			if err := cache.SetSnapshot(ctx, "fleet", snapshot()); err != nil {
				_ = out.Encode(map[string]any{"error": err.Error()})
				continue
			}
			_ = out.Encode(map[string]any{"changed": version})
		case "quit":
			g.Stop()
			return
		}
	}
}
