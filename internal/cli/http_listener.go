package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"
)

// httpTLSFlags put the HTTP listener behind TLS.
func (f *serverTLSFlags) registerHTTP(fs *flag.FlagSet) {
	fs.StringVar(&f.certFile, "http-tls-cert-file", "", "PEM certificate (chain) of --http-addr, which then serves HTTPS only")
	fs.StringVar(&f.keyFile, "http-tls-key-file", "", "PEM private key of --http-tls-cert-file")
	fs.StringVar(&f.clientCAFile, "http-tls-client-ca-file", "", "PEM CAs; HTTP clients (Prometheus, probes) must then present a certificate they signed")
}

// httpHandler is the relay's handler, plus Go's profiles under
// /debug/pprof/ when withProfiles (--http-pprof) is set. Profiles are off
// by default: a heap profile or goroutine dump shows memory and stacks an
// operator would not publish on a port that compose files bind to every
// interface.
func httpHandler(relay http.Handler, withProfiles bool) http.Handler {
	if !withProfiles {
		return relay
	}
	mux := http.NewServeMux()
	mux.Handle("/", relay)
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	return mux
}

// serveHTTP serves h on addr (with TLS when tlsCfg is set) until stop is
// called; it returns the address it listens on.
func serveHTTP(addr string, h http.Handler, tlsCfg *tls.Config, log *slog.Logger) (stop func(), bound string, err error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("--http-addr %s: %w", addr, err)
	}
	if tlsCfg != nil {
		l = tls.NewListener(l, tlsCfg)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("HTTP server stopped", "err", err)
		}
	}()
	log.Info("serving metrics and health", "addr", l.Addr().String(), "tls", tlsCfg != nil, "paths", strings.Join([]string{"/metrics", "/healthz", "/readyz"}, " "))
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}, l.Addr().String(), nil
}
