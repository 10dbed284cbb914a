package relay

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Handler serves /metrics (Prometheus), /healthz (the process is alive) and
// /readyz (200 only for the leader whose pipeline and sink work; the body
// names the role either way, and lists the source's warnings, which do not
// change the status: see Warner).
func (r *Relay) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(r.m.Registry, promhttp.HandlerOpts{EnableOpenMetrics: true}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, req *http.Request) {
		ctx, cancel := context.WithTimeout(req.Context(), 2*time.Second)
		defer cancel()
		body := struct {
			Role   Role   `json:"role"`
			Ready  bool   `json:"ready"`
			Reason string `json:"reason,omitempty"`
			// Warnings do not make the relay unready.
			Warnings []string `json:"warnings,omitempty"`
		}{Role: r.Role(), Ready: true}
		if w, ok := r.source.(Warner); ok {
			body.Warnings = w.Warnings(ctx)
		}
		status := http.StatusOK
		if err := r.Ready(ctx); err != nil {
			body.Ready, body.Reason, status = false, err.Error(), http.StatusServiceUnavailable
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		json.NewEncoder(w).Encode(body)
	})
	return mux
}
