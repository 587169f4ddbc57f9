package echo

import (
	"context"
	"flag"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// ClientFlags are the call-loop flags shared by xds-client and wrr-client.
type ClientFlags struct {
	Calls        *int
	Interval     *time.Duration
	Deadline     *time.Duration
	Batch        *int
	Keys         *int
	WaitForReady *bool
	Message      *string
	MaxSeconds   *time.Duration
	Parallel     *int
	Headers      KV
}

// RegisterClientFlags defines the shared flags on the default flag set.
func RegisterClientFlags() *ClientFlags {
	f := &ClientFlags{
		Calls:        flag.Int("calls", 100, "number of calls (the loop also ends on SIGTERM/SIGINT or -max-time)"),
		Interval:     flag.Duration("interval", 0, "pause between calls"),
		Deadline:     flag.Duration("deadline", 5*time.Second, "per-call deadline"),
		Batch:        flag.Int("batch", 0, "print a progress line every K calls (0: none)"),
		Keys:         flag.Int("keys", 0, "with a header value holding {i}: replace it by (call index mod K) and report which server each value reached"),
		WaitForReady: flag.Bool("wait-for-ready", false, "make calls wait-for-ready"),
		Message:      flag.String("message", "hello", "EchoRequest.message"),
		MaxSeconds:   flag.Duration("max-time", 10*time.Minute, "upper bound on the whole loop"),
		Parallel:     flag.Int("parallel", 1, "issue the calls N at a time, their starts -interval apart (a wave of N shares its first call's headers and deadline)"),
	}
	flag.Var(&f.Headers, "header", "request header k=v (repeatable); {i} in v is replaced by the call index (mod -keys)")
	return f
}

// RunCalls calls Echo.Unary in a loop on conn and prints JSON lines:
//
//	{"batch": k, "done": n, "t": s, "counts": {...this batch...}, "errors": e, "first_error": "..."}   every -batch calls
//	{"counts": {...}, "errors": n, "first_error": "...", "calls": n, "seconds": s, "codes": {...}}     at the end
//
// with "by_key": {value: {server: n}} added when -keys is set. SIGTERM/SIGINT
// ends the loop early (the final line says "interrupted": true). Returns the
// number of failed calls.
func RunCalls(conn *grpc.ClientConn, f *ClientFlags) int {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	stop := time.Now().Add(*f.MaxSeconds)

	total := map[string]int{}
	codes := map[string]int{}
	byKey := map[string]map[string]int{}
	batch := map[string]int{}
	errors, batchErrors := 0, 0
	firstError, batchFirst := "", ""
	start := time.Now()
	interrupted := false
	done := 0
	pairs := f.Headers.Pairs()
	var wave []outcome // -parallel: the outcomes of the current wave not counted yet
	opts := []grpc.CallOption{}
	if *f.WaitForReady {
		opts = append(opts, grpc.WaitForReady(true))
	}

loop:
	for i := 0; i < *f.Calls; i++ {
		select {
		case <-sigs:
			interrupted = true
			break loop
		default:
		}
		if time.Now().After(stop) {
			interrupted = true
			break
		}
		ctx, cancel := context.WithTimeout(context.Background(), *f.Deadline)
		key := ""
		if len(pairs) > 0 {
			kv := make([]string, 0, 2*len(pairs))
			for _, p := range pairs {
				v := p[1]
				if strings.Contains(v, "{i}") {
					n := i
					if *f.Keys > 0 {
						n = i % *f.Keys
					}
					v = strings.ReplaceAll(v, "{i}", strconv.Itoa(n))
					key = v
				}
				kv = append(kv, p[0], v)
			}
			ctx = metadata.AppendToOutgoingContext(ctx, kv...)
		}
		var server string
		var err error
		if *f.Parallel > 1 {
			if len(wave) == 0 {
				wave = callWave(ctx, conn, *f.Message, min(*f.Parallel, *f.Calls-i), *f.Interval, opts)
			}
			server, err = wave[0].server, wave[0].err
			wave = wave[1:]
		} else {
			server, err = call(ctx, conn, *f.Message, opts)
		}
		cancel()
		done++
		if err != nil {
			errors++
			batchErrors++
			st := status.Convert(err)
			codes[st.Code().String()]++
			msg := st.Code().String() + ": " + st.Message()
			if firstError == "" {
				firstError = msg
			}
			if batchFirst == "" {
				batchFirst = msg
			}
		} else {
			total[server]++
			batch[server]++
			if *f.Keys > 0 && key != "" {
				if byKey[key] == nil {
					byKey[key] = map[string]int{}
				}
				byKey[key][server]++
			}
		}
		if *f.Batch > 0 && done%*f.Batch == 0 {
			line := map[string]any{"batch": done / *f.Batch, "done": done, "t": time.Since(start).Seconds(),
				"counts": batch, "errors": batchErrors}
			if batchFirst != "" {
				line["first_error"] = batchFirst
			}
			Emit(line)
			batch = map[string]int{}
			batchErrors, batchFirst = 0, ""
		}
		if *f.Interval > 0 {
			select {
			case <-sigs:
				interrupted = true
				break loop
			case <-time.After(*f.Interval):
			}
		}
	}
	final := map[string]any{"counts": total, "errors": errors, "first_error": firstError, "calls": done,
		"seconds": time.Since(start).Seconds(), "codes": codes}
	if interrupted {
		final["interrupted"] = true
	}
	if *f.Keys > 0 {
		final["by_key"] = byKey
	}
	Emit(final)
	return errors
}

type outcome struct {
	server string
	err    error
}

func call(ctx context.Context, conn *grpc.ClientConn, message string, opts []grpc.CallOption) (string, error) {
	req := NewRequest()
	SetString(req, "message", message)
	reply := NewReply()
	if err := conn.Invoke(ctx, UnaryMethod, req, reply, opts...); err != nil {
		return "", err
	}
	return GetString(reply, "server"), nil
}

// callWave makes n calls together (started interval apart, all in flight at once) and returns their outcomes
// once all have ended.
func callWave(ctx context.Context, conn *grpc.ClientConn, message string, n int, interval time.Duration,
	opts []grpc.CallOption) []outcome {
	out := make([]outcome, n)
	var wg sync.WaitGroup
	for j := range out {
		if j > 0 && interval > 0 {
			time.Sleep(interval)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[j].server, out[j].err = call(ctx, conn, message, opts)
		}()
	}
	wg.Wait()
	return out
}
