package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	runpprof "runtime/pprof"
	"time"

	"github.com/spf13/pflag"
)

// profiling is the --pprof-addr and --cpuprofile pair of serve, stage and
// bench: both off unless given.
type profiling struct {
	addr    string
	cpuFile string
}

func profileFlags(fs *pflag.FlagSet) *profiling {
	p := &profiling{}
	fs.StringVar(&p.addr, "pprof-addr", "", "serve Go's pprof endpoints (/debug/pprof/) on this address; keep it private")
	fs.StringVar(&p.cpuFile, "cpuprofile", "", "write a CPU profile of the whole run to this file")
	return p
}

// start begins what was asked for and returns the function that ends it.
func (p *profiling) start(log *slog.Logger) (func(), error) {
	var stops []func()
	stop := func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	if p.cpuFile != "" {
		f, err := os.Create(p.cpuFile)
		if err != nil {
			return nil, fmt.Errorf("cpu profile: %w", err)
		}
		if err := runpprof.StartCPUProfile(f); err != nil {
			_ = f.Close()
			return nil, fmt.Errorf("cpu profile: %w", err)
		}
		stops = append(stops, func() { runpprof.StopCPUProfile(); _ = f.Close() })
	}
	if p.addr != "" {
		ln, err := net.Listen("tcp", p.addr)
		if err != nil {
			stop()
			return nil, fmt.Errorf("pprof endpoint: %w", err)
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		served := make(chan struct{})
		go func() {
			defer close(served)
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("pprof endpoint", "err", err)
			}
		}()
		log.Info("pprof endpoint", "addr", ln.Addr().String())
		stops = append(stops, func() { _ = srv.Close(); <-served })
	}
	return stop, nil
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
