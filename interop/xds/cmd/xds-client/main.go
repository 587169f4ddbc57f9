// xds-client dials an xds:/// target with grpc-go's xDS resolver (bootstrap from
// GRPC_XDS_BOOTSTRAP_CONFIG or GRPC_XDS_BOOTSTRAP) and calls
// /waypost.test.Echo/Unary in a bounded loop, printing JSON lines (see
// echo.RunCalls): progress per -batch calls and the final counts per server.
package main

import (
	"flag"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	_ "google.golang.org/grpc/xds" // registers the xds resolver and the xDS balancers

	"waypost.interop/xds/internal/echo"
)

func main() {
	target := flag.String("target", "", "xds:///NAME")
	cf := echo.RegisterClientFlags()
	flag.Parse()
	if *target == "" {
		echo.Fatalf("-target is required")
	}
	if os.Getenv("GRPC_XDS_BOOTSTRAP_CONFIG") == "" && os.Getenv("GRPC_XDS_BOOTSTRAP") == "" {
		echo.Fatalf("no xDS bootstrap: set GRPC_XDS_BOOTSTRAP_CONFIG")
	}
	conn, err := grpc.NewClient(*target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		echo.Fatalf("dial %s: %v", *target, err)
	}
	defer conn.Close()
	echo.RunCalls(conn, cf)
}
