// xds-targets dials several xds:/// targets from one process and calls
// /waypost.test.Echo/Unary on each in turn, as xds-client does (a
// {"target": T} line before each target's lines), then prints
// {"holding": true} and keeps every channel open until SIGTERM or SIGINT.
// grpc-go opens one xDS client, so one ADS stream, per data-plane target: a
// control plane sees several streams of the same node id from this process.
package main

import (
	"flag"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	_ "google.golang.org/grpc/xds" // registers the xds resolver and the xDS balancers

	"waypost.interop/xds/internal/echo"
)

type targets []string

func (t *targets) String() string     { return strings.Join(*t, ",") }
func (t *targets) Set(s string) error { *t = append(*t, s); return nil }

func main() {
	var ts targets
	flag.Var(&ts, "target", "xds:///NAME (repeatable)")
	cf := echo.RegisterClientFlags()
	flag.Parse()
	if len(ts) == 0 {
		echo.Fatalf("-target is required")
	}
	if os.Getenv("GRPC_XDS_BOOTSTRAP_CONFIG") == "" && os.Getenv("GRPC_XDS_BOOTSTRAP") == "" {
		echo.Fatalf("no xDS bootstrap: set GRPC_XDS_BOOTSTRAP_CONFIG")
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	conns := make([]*grpc.ClientConn, 0, len(ts))
	for _, t := range ts {
		conn, err := grpc.NewClient(t, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			echo.Fatalf("dial %s: %v", t, err)
		}
		defer conn.Close()
		conns = append(conns, conn)
	}
	for i, t := range ts {
		echo.Emit(map[string]any{"target": t})
		echo.RunCalls(conns[i], cf)
	}
	echo.Emit(map[string]any{"holding": true})
	<-sigs
}
