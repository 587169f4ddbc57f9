// Package fastoob serves xds.service.orca.v3.OpenRcaService/StreamCoreMetrics
// from a grpc-go orca.ServerMetricsProvider with a reporting-interval floor
// below grpc-go's fixed 30 s (orca.Register raises any shorter requested
// interval to 30 s, and its knob to lower it is internal to grpc-go). It is
// only used when orca-server is given -oob-floor; the reports are built from
// the same recorder, field for field as grpc-go's own service does.
package fastoob

import (
	"time"

	v3orcapb "github.com/cncf/xds/go/xds/data/orca/v3"
	v3orcaservicepb "github.com/cncf/xds/go/xds/service/orca/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/orca"
)

type service struct {
	v3orcaservicepb.UnimplementedOpenRcaServiceServer
	floor    time.Duration
	provider orca.ServerMetricsProvider
}

// Register serves OpenRcaService on s, reporting at the client's requested
// interval but never more often than floor.
func Register(s grpc.ServiceRegistrar, provider orca.ServerMetricsProvider, floor time.Duration) {
	v3orcaservicepb.RegisterOpenRcaServiceServer(s, &service{floor: floor, provider: provider})
}

// Report converts grpc-go's ServerMetrics (unset fields are -1) to the proto.
func Report(sm *orca.ServerMetrics) *v3orcapb.OrcaLoadReport {
	r := &v3orcapb.OrcaLoadReport{Utilization: sm.Utilization}
	if sm.CPUUtilization != -1 {
		r.CpuUtilization = sm.CPUUtilization
	}
	if sm.MemUtilization != -1 {
		r.MemUtilization = sm.MemUtilization
	}
	if sm.AppUtilization != -1 {
		r.ApplicationUtilization = sm.AppUtilization
	}
	if sm.QPS != -1 {
		r.RpsFractional = sm.QPS
	}
	if sm.EPS != -1 {
		r.Eps = sm.EPS
	}
	return r
}

func (s *service) StreamCoreMetrics(req *v3orcaservicepb.OrcaLoadReportRequest, stream v3orcaservicepb.OpenRcaService_StreamCoreMetricsServer) error {
	interval := s.floor
	if req.GetReportInterval() != nil && req.GetReportInterval().AsDuration() > interval {
		interval = req.GetReportInterval().AsDuration()
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		if err := stream.Send(Report(s.provider.ServerMetrics())); err != nil {
			return err
		}
		select {
		case <-stream.Context().Done():
			return stream.Context().Err()
		case <-ticker.C:
		}
	}
}
